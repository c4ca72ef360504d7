"""timm encoders: ViT layer/prefix selection and CNN feature maps equal timm's own outputs."""

import json

import pytest
import timm
import torch
from PIL import Image
from safetensors.torch import load_file

from graft.encoders import EncoderConfig, build_encoder
from graft.errors import GraftConfigError
from tests.vision_fixtures import TINY_VIT_KWARGS


def _timm_model(name, path, **kwargs):
    model = timm.create_model(name, pretrained=False, **kwargs).eval()
    model.load_state_dict(load_file(path))
    return model


def _img(w=45, h=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    return Image.fromarray(torch.randint(0, 256, (h, w, 3), generator=g, dtype=torch.uint8).numpy())


@pytest.mark.parametrize("layer, block", [(-2, 0), (-1, 1), (1, 0), (2, 1)])
def test_vit_layer_equals_timm_block_output(tiny_encoder_config, tiny_timm_vit_file, layer, block):
    enc = build_encoder(tiny_encoder_config("timm_vit", feature_layer=layer))
    ref = _timm_model("vit_tiny_patch16_224", tiny_timm_vit_file, **TINY_VIT_KWARGS)
    inputs = enc.preprocess([_img(), _img(20, 70, seed=1)])
    assert inputs.pixel_values.shape == (2, 3, 32, 32)  # squashed to the model's own input size
    feats = enc.encode(inputs)
    with torch.no_grad():
        want = ref.forward_intermediates(inputs.pixel_values, indices=[block], norm=False, output_fmt="NLC",
                                         intermediates_only=True)[0]
    assert enc.hidden_size == 32 and enc.token_grid(45, 30) == (4, 4)
    for i, f in enumerate(feats):
        assert f.shape == (enc.num_tokens(45, 30), 32) == (16, 32)
        assert torch.equal(f, want[i])


def test_vit_keeps_prefix_tokens_when_asked(tiny_encoder_config, tiny_timm_vit_file):
    enc = build_encoder(tiny_encoder_config("timm_vit", drop_prefix=False, feature_layer=-1))
    ref = _timm_model("vit_tiny_patch16_224", tiny_timm_vit_file, **TINY_VIT_KWARGS)
    inputs = enc.preprocess([_img()])
    feats = enc.encode(inputs)[0]
    with torch.no_grad():
        x = ref.patch_embed(inputs.pixel_values)
        x = ref.blocks(ref.norm_pre(ref._pos_embed(x)))  # CLS first, then 16 patches
    assert enc.num_tokens(1, 1) == 17 and torch.equal(feats, x[0])


def test_vit_pth_nested_state_dict_and_image_size(tiny_encoder_config, tiny_timm_vit_file, tmp_path):
    pth = tmp_path / "vit.pth"
    torch.save({"state_dict": load_file(tiny_timm_vit_file), "epoch": 3}, pth)
    a = build_encoder(tiny_encoder_config("timm_vit"))
    b = build_encoder(tiny_encoder_config("timm_vit", path=str(pth)))
    img = [_img()]
    assert torch.equal(a.encode(a.preprocess(img))[0], b.encode(b.preprocess(img))[0])
    big = build_encoder(tiny_encoder_config("timm_vit", image_size=48))  # pos-embed resampled to 6x6
    assert big.num_tokens(10, 10) == 36
    assert big.encode(big.preprocess(img))[0].shape == (36, 32)


def test_cnn_last_feature_map_as_tokens(tiny_encoder_config, tiny_timm_cnn_file):
    enc = build_encoder(tiny_encoder_config("timm_cnn"))
    # The file has the ImageNet classifier; the encoder drops it (num_classes=0).
    ref = timm.create_model("efficientnet_lite0", pretrained=False).eval()
    ref.load_state_dict(load_file(tiny_timm_cnn_file))
    inputs = enc.preprocess([_img(), _img(64, 64, seed=2)])
    assert inputs.pixel_values.shape == (2, 3, 64, 64)
    feats = enc.encode(inputs)
    with torch.no_grad():
        fmap = ref.forward_features(inputs.pixel_values)  # [2, 1280, 2, 2]
    assert enc.hidden_size == 1280 and enc.token_grid(500, 300) == (2, 2) and enc.num_tokens(500, 300) == 4
    for i, f in enumerate(feats):
        assert f.shape == (4, 1280)
        assert torch.equal(f, fmap[i].flatten(1).T)
    enc.train()  # BatchNorm must keep its running statistics
    assert not enc.training and torch.equal(enc.encode(inputs)[0], feats[0])


def test_cnn_stage_picks_an_earlier_feature_map(tiny_encoder_config, tiny_timm_cnn_file):
    cfg = tiny_encoder_config("timm_cnn")
    cfg.cnn_stage = 3  # efficientnet_lite0 stage 3: 112 channels at stride 16
    enc = build_encoder(cfg)
    ref = timm.create_model("efficientnet_lite0", pretrained=False).eval()
    ref.load_state_dict(load_file(tiny_timm_cnn_file))
    inputs = enc.preprocess([_img(64, 64, seed=3)])
    with torch.no_grad():
        fmap = ref.forward_intermediates(inputs.pixel_values, indices=[3], intermediates_only=True)[0]
    assert enc.hidden_size == 112 and enc.token_grid(64, 64) == (4, 4) and enc.num_tokens(64, 64) == 16
    assert torch.equal(enc.encode(inputs)[0], fmap[0].flatten(1).T)
    assert json.loads(enc.identity())["cnn_stage"] == 3
    cfg.cnn_stage = 7
    with pytest.raises(GraftConfigError, match=r"cnn_stage=7 is out of range.*3: 112ch/16x"):
        build_encoder(cfg)


def test_cnn_stages_merged_on_the_coarsest_grid(tiny_encoder_config, tiny_timm_cnn_file):
    import torch.nn.functional as F

    ref = timm.create_model("efficientnet_lite0", pretrained=False).eval()
    ref.load_state_dict(load_file(tiny_timm_cnn_file))
    single = build_encoder(tiny_encoder_config("timm_cnn", cnn_stage=3))
    avg = build_encoder(tiny_encoder_config("timm_cnn", cnn_stage=[2, 3]))
    unshuffle = build_encoder(tiny_encoder_config("timm_cnn", cnn_stage=[2, -2], cnn_downsample="unshuffle"))
    inputs = avg.preprocess([_img(64, 64, seed=4), _img(30, 50, seed=5)])
    with torch.no_grad():  # 64 px: stage 2 is 40ch at 8x8, stage 3 112ch at 4x4
        s2, s3 = ref.forward_intermediates(inputs.pixel_values, indices=[2, 3], intermediates_only=True)
    assert s2.shape[1:] == (40, 8, 8) and s3.shape[1:] == (112, 4, 4)
    want_avg = torch.cat([F.avg_pool2d(s2, 2), s3], 1)  # an exact 2x2 mean, channels [stage 2 | stage 3]
    want_unshuffle = torch.cat([F.pixel_unshuffle(s2, 2), s3], 1)  # 160 + 112 channels
    for enc, want in ((avg, want_avg), (unshuffle, want_unshuffle)):
        assert enc.hidden_size == want.shape[1] and enc.token_grid(30, 50) == (4, 4) and enc.num_tokens(1, 1) == 16
        for i, f in enumerate(enc.encode(inputs)):
            torch.testing.assert_close(f, want[i].flatten(1).T, rtol=0, atol=1e-5)
    # The stage-3 channels are the single-stage features, untouched.
    torch.testing.assert_close(avg.encode(inputs)[0][:, 40:], single.encode(inputs)[0], rtol=0, atol=0)
    # Listed order is channel order.
    rev = build_encoder(tiny_encoder_config("timm_cnn", cnn_stage=[3, 2]))
    torch.testing.assert_close(rev.encode(inputs)[1], torch.cat([s3, F.avg_pool2d(s2, 2)], 1)[1].flatten(1).T,
                               rtol=0, atol=1e-5)
    # Stages and merge are part of the identity (feature cache keys); single-stage keys are unchanged.
    idents = {json.dumps(json.loads(e.identity()), sort_keys=True) for e in (single, avg, unshuffle, rev)}
    assert len(idents) == 4
    assert json.loads(avg.identity())["cnn_stage"] == [2, 3] and json.loads(avg.identity())["cnn_downsample"] == "avg"
    assert "cnn_downsample" not in json.loads(single.identity())


def test_cnn_global_max_repeats_each_early_channels_image_max(tiny_encoder_config, tiny_timm_cnn_file):
    ref = timm.create_model("efficientnet_lite0", pretrained=False).eval()
    ref.load_state_dict(load_file(tiny_timm_cnn_file))
    enc = build_encoder(tiny_encoder_config("timm_cnn", cnn_stage=[3, 0], cnn_downsample="global_max"))
    inputs = enc.preprocess([_img(64, 64, seed=6), _img(40, 20, seed=7)])
    with torch.no_grad():  # 64 px: stage 0 is 16ch at 32x32, stage 3 112ch at 4x4
        s0, s3 = ref.forward_intermediates(inputs.pixel_values, indices=[0, 3], intermediates_only=True)
    assert enc.hidden_size == 128 and enc.token_grid(1, 1) == (4, 4)
    for i, f in enumerate(enc.encode(inputs)):
        torch.testing.assert_close(f[:, :112], s3[i].flatten(1).T, rtol=0, atol=1e-5)
        # every token carries the same 16 values: stage 0's maximum over all 32x32 positions
        torch.testing.assert_close(f[:, 112:], s0[i].amax((1, 2)).expand(16, 16), rtol=0, atol=1e-5)
    # the two images differ there (it is per image, not a constant)
    assert not torch.allclose(enc.encode(inputs)[0][0, 112:], enc.encode(inputs)[1][0, 112:])
    assert json.loads(enc.identity())["cnn_downsample"] == "global_max"


def test_cnn_stage_list_errors(tiny_encoder_config):
    with pytest.raises(GraftConfigError, match=r"cnn_stage=\[2, 7\] is out of range.*3: 112ch/16x"):
        build_encoder(tiny_encoder_config("timm_cnn", cnn_stage=[2, 7]))
    with pytest.raises(GraftConfigError, match=r"cnn_stage=\[3, -2\] names a stage twice"):
        build_encoder(tiny_encoder_config("timm_cnn", cnn_stage=[3, -2]))
    with pytest.raises(GraftConfigError, match=r"encoder.cnn_stage must be .*got an empty list; use null"):
        EncoderConfig.from_dict({"cnn_stage": []})
    with pytest.raises(GraftConfigError, match=r"encoder.cnn_stage must be .*list of distinct stage indices.*got '3'"):
        EncoderConfig.from_dict({"cnn_stage": [2, "3"]})
    with pytest.raises(GraftConfigError, match=r"encoder.cnn_stage must be .*got True"):
        EncoderConfig.from_dict({"cnn_stage": True})
    with pytest.raises(GraftConfigError, match=r"encoder.cnn_downsample must be one of avg, unshuffle, global_max, got 'max'"):
        EncoderConfig.from_dict({"cnn_stage": [2, 3], "cnn_downsample": "max"})
    # 72 px: stage 2 is 9x9, stage 3 5x5 -- no whole factor, so unshuffle names the way out; avg still fits.
    with pytest.raises(GraftConfigError, match=r"cnn_downsample=unshuffle: stage 2's 9x9 grid .*use cnn_downsample: avg"):
        build_encoder(tiny_encoder_config("timm_cnn", cnn_stage=[2, 3], cnn_downsample="unshuffle", image_size=72))
    enc = build_encoder(tiny_encoder_config("timm_cnn", cnn_stage=[2, 3], image_size=72))
    assert enc.token_grid(1, 1) == (5, 5) and enc.hidden_size == 152


def test_random_init_is_seeded_and_identity(tiny_encoder_config):
    cfg = dict(kind="timm", model_name="vit_tiny_patch16_224", timm_kwargs=dict(TINY_VIT_KWARGS))
    a, b = build_encoder(EncoderConfig(**cfg)), build_encoder(EncoderConfig(**cfg))
    c = build_encoder(EncoderConfig(**cfg, seed=1))
    img = [_img()]
    fa, fb, fc = (e.encode(e.preprocess(img))[0] for e in (a, b, c))
    assert torch.equal(fa, fb) and not torch.equal(fa, fc)
    assert a.identity() == b.identity() != c.identity()
    assert json.loads(a.identity())["weights"] == "random-init seed=0"
    loaded = build_encoder(tiny_encoder_config("timm_vit"))
    ident = json.loads(loaded.identity())
    assert ident["weights"]["model.safetensors"] and ident["preprocess"]["size"] == [32, 32]


def test_bad_inputs(tiny_encoder_config, tiny_timm_vit_file, tmp_path):
    with pytest.raises(GraftConfigError, match="encoder.model_name is required"):
        build_encoder(EncoderConfig(kind="timm"))
    with pytest.raises(GraftConfigError, match="not a timm model"):
        build_encoder(EncoderConfig(kind="timm", model_name="no_such_net"))
    with pytest.raises(GraftConfigError, match="encoder.path: weights file .* does not exist"):
        build_encoder(tiny_encoder_config("timm_vit", path=str(tmp_path / "missing.safetensors")))
    deeper = dict(TINY_VIT_KWARGS, depth=3)
    with pytest.raises(GraftConfigError, match=r"missing 1?\d key\(s\).*blocks\.2"):
        build_encoder(tiny_encoder_config("timm_vit", timm_kwargs=deeper))
    wider = dict(TINY_VIT_KWARGS, embed_dim=64)
    with pytest.raises(GraftConfigError, match="shape mismatch"):
        build_encoder(tiny_encoder_config("timm_vit", timm_kwargs=wider))
    with pytest.raises(GraftConfigError, match="feature_layer=0 is out of range"):
        build_encoder(tiny_encoder_config("timm_vit", feature_layer=0))
    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(GraftConfigError, match="not a loadable torch checkpoint"):
        build_encoder(tiny_encoder_config("timm_vit", path=str(junk)))
