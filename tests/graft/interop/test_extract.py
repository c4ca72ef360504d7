"""graft extract: Kimi-K2.5, Kimi-VL and HF Llava donors -> encoder dir + adapter dir."""

import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from graft.adapters import load_adapter
from graft.encoders import EncoderConfig, build_encoder
from graft.errors import GraftConfigError
from graft.interop.extract import extract, kimi_projector_adapter
from tests.kimi_donors import LLM_SHARD, VISION_SHARD


def _images():
    rng = np.random.default_rng(3)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
            for w, h in [(90, 60), (40, 130)]]


def _kimi_reference(model, enc, images):
    """transformers' Kimi-K2.5 vision tower + mm_projector on our preprocessed patches."""
    inputs = enc.preprocess(images)
    thw = torch.tensor([[1, h, w] for h, w in inputs.extra["patch_grids"]])
    with torch.no_grad():
        feats = model.model.get_image_features(inputs.pixel_values, thw).pooler_output
    return inputs, list(feats)


@pytest.mark.parametrize("donor", ["k25_dir", "kimi_vl_dir"])
def test_kimi_donor_without_its_llm(donor, kimi_model, request, tmp_path, capsys):
    from graft.cli import main

    src = request.getfixturevalue(donor)
    shutil.copytree(src, tmp_path / "donor")
    (tmp_path / "donor" / LLM_SHARD).unlink()  # extraction must never need the LLM
    assert main(["extract", str(tmp_path / "donor"), str(tmp_path / "out"), "--part", "both"]) == 0
    summary = json.loads((tmp_path / "out" / "extract.json").read_text())
    assert summary["shards_read"] == [VISION_SHARD]
    assert json.loads(capsys.readouterr().out)["encoder"]["kind"] == "moonvit"

    enc = build_encoder(EncoderConfig.from_dict(summary["encoder"]))
    adapter = load_adapter(tmp_path / "out" / "projector", d_vision=enc.hidden_size)
    assert adapter.config.layer_norm and adapter.config.norm_chunks == 4
    images = _images()
    inputs, ref = _kimi_reference(kimi_model, enc, images)
    ours = [adapter(f) for f in enc.encode(inputs)]  # MoonViT + Kimi's projector, in graft
    assert [o.shape for o in ours] == [r.shape for r in ref]
    assert max((o - r).abs().max().item() for o, r in zip(ours, ref)) <= 1e-4


def test_extracted_vision_dir_loads_in_transformers(kimi_model, k25_dir, tmp_path):
    from transformers.models.kimi_k25.modeling_kimi_k25 import Kimi_K25VisionModel

    extract(k25_dir, tmp_path / "out", "vision")
    assert not (tmp_path / "out" / "projector").exists()
    tower = Kimi_K25VisionModel.from_pretrained(str(tmp_path / "out" / "vision")).eval()
    patches, thw = torch.randn(24, 3, 14, 14), torch.tensor([[1, 4, 6]])
    with torch.no_grad():
        a = tower(patches, thw).pooler_output
        b = kimi_model.model.vision_tower(patches, thw).pooler_output
    assert torch.equal(a, b)


def test_kimi_projector_seeds_an_adapter_for_another_llm(kimi_model, k25_dir):
    adapter = kimi_projector_adapter(k25_dir, d_model=48, seed=5)
    kimi = kimi_model.model.mm_projector
    assert torch.equal(adapter.norm.weight, kimi.pre_norm.weight)
    assert torch.equal(adapter.mlp.linears[0].weight, kimi.in_proj.weight)
    assert tuple(adapter.mlp.linears[1].weight.shape) == (48, 128)  # new, for the target LLM
    again = kimi_projector_adapter(k25_dir, d_model=48, seed=5)
    assert torch.equal(adapter.mlp.linears[1].weight, again.mlp.linears[1].weight)


def test_llava_donor(tiny_llama, tiny_clip_dir, tmp_path):
    """An HF Llava checkpoint saved by transformers -> clip encoder + mlp adapter = Llava's features."""
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    from graft.interop.export_llava import export_llava
    from tests.run_dirs import write_run_dir

    run = write_run_dir(tmp_path / "run", tiny_llama, {"kind": "clip", "path": str(tiny_clip_dir)},
                        {"kind": "mlp", "depth": 2})
    export_llava(run, tmp_path / "exported")
    llava = LlavaForConditionalGeneration.from_pretrained(str(tmp_path / "exported")).eval()
    donor = tmp_path / "donor"
    llava.save_pretrained(str(donor), max_shard_size="200KB")  # transformers' own layout, sharded
    processor = AutoProcessor.from_pretrained(str(tmp_path / "exported"))
    processor.save_pretrained(str(donor))

    summary = extract(donor, tmp_path / "out", "both")
    assert summary["encoder"]["kind"] == "clip" and summary["encoder"]["drop_prefix"] is True
    index = json.loads((donor / "model.safetensors.index.json").read_text())["weight_map"]
    llm_only = {f for k, f in index.items()} - {index[k] for k in index
                                                if "vision_tower" in k or "multi_modal" in k}
    assert llm_only and not set(summary["shards_read"]) & llm_only
    enc = build_encoder(EncoderConfig.from_dict(summary["encoder"]))
    adapter = load_adapter(tmp_path / "out" / "projector")
    images = _images()
    ours = [adapter(f) for f in enc.encode(enc.preprocess(images))]
    pixels = processor.image_processor(images=images, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        ref = llava.model.get_image_features(pixels).pooler_output
    assert max((o - r).abs().max().item() for o, r in zip(ours, ref)) <= 1e-5


def test_bad_donors(tmp_path, tiny_clip_dir, k25_dir):
    with pytest.raises(GraftConfigError, match="model_type 'clip_vision_model' is not supported"):
        extract(tiny_clip_dir, tmp_path / "a")
    with pytest.raises(GraftConfigError, match="--part 'head'"):
        extract(k25_dir, tmp_path / "b", "head")
    donor = tmp_path / "no_projector"
    shutil.copytree(k25_dir, donor)
    index = json.loads((donor / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if "mm_projector" not in k}
    (donor / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(GraftConfigError, match=r"pre_norm\.weight.*expected 'multi_modal_projector"):
        extract(donor, tmp_path / "c", "projector")


def test_target_llm_remakes_only_the_last_linear(kimi_model, k25_dir, tiny_llama, tmp_path):
    from graft.cli import main

    args = ["extract", str(k25_dir), str(tmp_path / "out"), "--part", "projector",
            "--target-llm", str(tiny_llama), "--seed", "3"]
    assert main(args) == 0
    adapter = load_adapter(tmp_path / "out" / "projector")
    assert adapter.d_model == 64 and adapter.d_vision == 128
    assert torch.equal(adapter.mlp.linears[0].bias, kimi_model.model.mm_projector.in_proj.bias)
    assert not torch.equal(adapter.mlp.linears[1].weight, kimi_model.model.mm_projector.out_proj.weight)
    summary = json.loads((tmp_path / "out" / "extract.json").read_text())
    assert summary["adapter"]["seeded_for"] == str(tiny_llama) and "encoder" not in summary


def test_projector_shapes_that_do_not_chain(k25_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    donor = tmp_path / "donor"
    shutil.copytree(k25_dir, donor)
    tensors = load_file(str(donor / VISION_SHARD))
    tensors["mm_projector.proj.2.weight"] = torch.zeros(64, 100)
    save_file(tensors, str(donor / VISION_SHARD))
    with pytest.raises(GraftConfigError, match=r"linear_2 \(64, 100\).*linear_2 input = linear_1 output"):
        extract(donor, tmp_path / "out", "projector")
