"""MoonViT vs transformers' Kimi_K25VisionModel, the Kimi layouts, processor and token budget."""

import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from graft.encoders import EncoderConfig, build_encoder
from graft.encoders.base import EncoderInputs
from graft.errors import GraftConfigError, GraftDataError


def _images(sizes, seed=0):
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in sizes]


def _moonvit(path, **kw):
    return build_encoder(EncoderConfig(kind="moonvit", path=str(path), feature_layer=-1, **kw))


def _reference(model, patches, grids):
    thw = torch.tensor([[1, h, w] for h, w in grids])
    with torch.no_grad():
        pooled = model.model.vision_tower(patches, thw).pooler_output  # [tokens, 4, d]
    return pooled.flatten(1)


@pytest.mark.parametrize("grids", [[(4, 6)], [(8, 8)], [(4, 6), (8, 8), (10, 4), (2, 2)]],
                         ids=["single", "table-size", "packed-4"])
def test_matches_transformers_k25(kimi_model, k25_dir, grids):
    enc = _moonvit(k25_dir)
    torch.manual_seed(1)
    patches = torch.randn(sum(h * w for h, w in grids), 3, 14, 14)
    inputs = EncoderInputs(patches, [(0, 0)] * len(grids), [(h // 2, w // 2) for h, w in grids],
                           {"patch_grids": grids})
    ours = enc.encode(inputs)
    assert [o.shape[0] for o in ours] == [h * w // 4 for h, w in grids]
    assert ours[0].shape[1] == enc.hidden_size == 4 * 32
    diff = (torch.cat(ours) - _reference(kimi_model, patches, grids)).abs().max().item()
    assert diff <= 1e-4, diff


def test_images_end_to_end_match_transformers_processor(kimi_model, k25_dir):
    from transformers.models.kimi_k25.image_processing_kimi_k25 import Kimi_K25ImageProcessor

    enc = _moonvit(k25_dir)
    images = _images([(70, 50), (200, 300), (1000, 37), (28, 28)])
    hf = Kimi_K25ImageProcessor(max_patches=256, size={"max_height": 16, "max_width": 16})
    ref_in = hf(images=images, return_tensors="pt")
    inputs = enc.preprocess(images)
    assert torch.equal(inputs.pixel_values, ref_in["pixel_values"])
    assert inputs.extra["patch_grids"] == [tuple(g[1:]) for g in ref_in["image_grid_thw"].tolist()]
    feats = enc.encode(inputs)
    counts = [f.shape[0] for f in feats]
    assert len(set(counts)) > 1  # native resolution: different sizes, different counts
    assert counts == [enc.num_tokens(*im.size) for im in images]
    assert [tuple(g) for g in inputs.grids] == [enc.token_grid(*im.size) for im in images]
    grids = inputs.extra["patch_grids"]
    ref = _reference(kimi_model, ref_in["pixel_values"], grids)
    assert (torch.cat(feats) - ref).abs().max().item() <= 1e-4


def test_all_layouts_load_the_same_numbers(k25_dir, hf_names_dir, kimi_vl_dir):
    states = [_moonvit(d).model.state_dict() for d in (k25_dir, hf_names_dir, kimi_vl_dir)]
    for other in states[1:]:
        assert other.keys() == states[0].keys()
        for key in states[0]:
            assert torch.equal(other[key], states[0][key]), key


def test_reads_only_the_vision_shard(k25_dir, tmp_path):
    from tests.kimi_donors import LLM_SHARD, VISION_SHARD

    donor = tmp_path / "donor"
    shutil.copytree(k25_dir, donor)
    (donor / LLM_SHARD).unlink()  # the language model is gone: loading must not need it
    enc = _moonvit(donor)
    assert [p.name for p in enc.weight_files()] == [VISION_SHARD]
    assert json.loads(enc.identity())["kind"] == "moonvit"


def test_max_image_tokens_caps_every_size(k25_dir):
    enc = _moonvit(k25_dir, max_image_tokens=6)
    sizes = [(640, 480), (37, 1000), (300, 300), (20, 20), (5000, 30)]
    for w, h in sizes:
        assert 1 <= enc.num_tokens(w, h) <= 6, (w, h)
    free = _moonvit(k25_dir)
    assert free.num_tokens(640, 480) > enc.num_tokens(640, 480)
    feats = enc.encode(enc.preprocess(_images(sizes[:3])))
    assert [f.shape[0] for f in feats] == [enc.num_tokens(w, h) for w, h in sizes[:3]]


def test_feature_layer_selects_a_block(kimi_model, k25_dir):
    grids = [(4, 4)]
    patches = torch.randn(16, 3, 14, 14)
    inputs = EncoderInputs(patches, [(0, 0)], [(2, 2)], {"patch_grids": grids})
    out = _moonvit(k25_dir, max_image_tokens=None).encode(inputs)[0]
    thw = torch.tensor([[1, 4, 4]])
    with torch.no_grad():
        hf = kimi_model.model.vision_tower(patches, thw, output_hidden_states=True)
    first = build_encoder(EncoderConfig(kind="moonvit", path=str(k25_dir), feature_layer=1))
    got = first.encode(inputs)[0]
    want = hf.hidden_states[1].view(2, 2, 2, 2, -1).permute(0, 2, 1, 3, 4).reshape(4, -1)
    assert (got - want).abs().max().item() <= 1e-4
    assert not torch.allclose(got, out)


# ---- bad input ---------------------------------------------------------------------------

def test_donor_without_vision_keys(tmp_path, k25_dir):
    from safetensors.torch import save_file

    (tmp_path / "config.json").write_text((k25_dir / "config.json").read_text())
    save_file({"language_model.model.embed_tokens.weight": torch.zeros(4, 4)},
              str(tmp_path / "model.safetensors"))
    with pytest.raises(GraftConfigError, match="vision_tower.encoder.blocks.0.wqkv.weight"):
        _moonvit(tmp_path)


def test_missing_and_mismatched_tensors(tmp_path, k25_dir):
    from safetensors.torch import load_file, save_file

    from tests.kimi_donors import VISION_SHARD

    donor = tmp_path / "donor"
    shutil.copytree(k25_dir, donor)
    cfg = json.loads((donor / "config.json").read_text())
    cfg["vision_config"]["intermediate_size"] = 48  # config no longer matches the weights
    (donor / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(GraftConfigError, match=r"mlp\.fc0\.weight.*\(64, 32\), expected \(48, 32\)"):
        _moonvit(donor)

    cfg["vision_config"]["intermediate_size"] = 64
    (donor / "config.json").write_text(json.dumps(cfg))
    tensors = load_file(str(donor / VISION_SHARD))
    del tensors["vision_tower.encoder.blocks.1.wo.weight"]
    save_file(tensors, str(donor / VISION_SHARD))
    with pytest.raises(GraftConfigError, match=r"blocks\.1\.wo\.weight"):
        _moonvit(donor)


def test_grid_beyond_position_table(k25_dir, tmp_path):
    enc = _moonvit(k25_dir)
    grids = [(514, 2)]  # taller than Kimi's 512 x 512 RoPE position table
    inputs = EncoderInputs(torch.zeros(514 * 2, 3, 14, 14), [(28, 7196)], [(257, 1)],
                           {"patch_grids": grids})
    with pytest.raises(GraftDataError, match=r"514x2 exceeds .* 512x512"):
        enc.encode(inputs)

    donor = tmp_path / "donor"
    shutil.copytree(k25_dir, donor)
    proc = json.loads((donor / "preprocessor_config.json").read_text())
    proc["size"] = {"max_height": 1024, "max_width": 1024}
    (donor / "preprocessor_config.json").write_text(json.dumps(proc))
    with pytest.raises(GraftConfigError, match="1024 patches per side .* covers 512"):
        _moonvit(donor)


def test_crop_mode_of_kimi_vl_processor():
    from graft.encoders.moonvit_processor import MoonViTProcessorConfig, preprocess, token_grid

    cfg = MoonViTProcessorConfig(pad_input=False)
    image = _images([(100, 70)])[0]
    patches, grids = preprocess([image], cfg)
    assert grids == [(4, 6)] and token_grid(100, 70, cfg) == (2, 3)  # 84 x 56 px kept
    pixels = (torch.from_numpy(np.array(image)).permute(2, 0, 1).float() - 127.5) / 127.5
    top, left = round((70 - 56) / 2), round((100 - 84) / 2)
    first = pixels[:, top:top + 14, left:left + 14]
    assert torch.allclose(patches[0], first, atol=1e-6)
    assert token_grid(20, 20, cfg) == (1, 1)  # below 28 px a side is padded, never cropped to 0
