"""EncoderConfig parsing and the kind registry, plus encoder -> projector token counts."""

import pytest
from PIL import Image

from graft.encoders import EncoderConfig, build_encoder, register_encoder
from graft.errors import GraftConfigError


def test_from_dict_round_trip_and_errors():
    cfg = EncoderConfig.from_dict({"kind": "clip", "path": "ckpts/clip", "feature_layer": -1})
    assert EncoderConfig.from_dict(cfg.to_dict()) == cfg
    assert EncoderConfig.from_dict(None) == EncoderConfig()
    with pytest.raises(GraftConfigError, match=r"unknown encoder field\(s\) 'layer'.*allowed: kind, path"):
        EncoderConfig.from_dict({"kind": "clip", "layer": -2})
    with pytest.raises(GraftConfigError, match="encoder.feature_layer must be an integer"):
        EncoderConfig.from_dict({"feature_layer": "-2"})
    with pytest.raises(GraftConfigError, match="encoder.image_size must be positive"):
        EncoderConfig.from_dict({"image_size": 0})


def test_unknown_kind_lists_known_kinds():
    with pytest.raises(GraftConfigError, match="unknown encoder.kind 'dino'; known kinds: clip, moonvit, siglip, timm"):
        build_encoder({"kind": "dino"})


def test_registry_lists_builtin_kinds_and_accepts_new_ones():
    from graft.encoders import ENCODERS

    assert {"timm", "siglip", "clip"} <= set(ENCODERS)
    base = ENCODERS["timm"]

    @register_encoder("timm_alias")
    class Alias(base):
        pass

    try:
        enc = build_encoder({"kind": "timm_alias", "model_name": "vit_tiny_patch16_224",
                             "timm_kwargs": {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 1,
                                             "num_heads": 2}, "feature_layer": -1})
        assert isinstance(enc, Alias) and enc.num_tokens(8, 8) == 16
    finally:
        ENCODERS.pop("timm_alias")


@pytest.fixture(scope="module")
def built(tiny_encoder_config):
    cache = {}

    def get(kind):
        if kind not in cache:
            cache[kind] = build_encoder(tiny_encoder_config(kind))
        return cache[kind]

    return get


@pytest.mark.parametrize("kind", ["siglip", "clip", "timm_vit", "timm_cnn"])
@pytest.mark.parametrize("adapter", ["mlp", "pixel_shuffle", "resampler"])
def test_projector_token_count_matches_prediction(built, kind, adapter):
    from graft.adapters import AdapterConfig, build_adapter

    enc = built(kind)
    proj = build_adapter(AdapterConfig(kind=adapter, num_queries=3, num_heads=2), enc.hidden_size, 16)
    img = Image.new("RGB", (70, 40), (10, 200, 30))
    grid = enc.token_grid(*img.size)
    (feats,) = enc.encode(enc.preprocess([img]))
    assert feats.shape[0] == enc.num_tokens(*img.size)
    assert proj(feats, grid=grid).shape == (proj.num_output_tokens(enc.num_tokens(*img.size), grid), 16)


def test_config_imports_stay_torch_free():
    # graft's CLI parses specs before deciding to load models; the config layer must stay light.
    import subprocess
    import sys

    code = ("import sys, graft.encoders, graft.adapters; from graft.encoders import EncoderConfig; "
            "from graft.adapters import AdapterConfig; assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
