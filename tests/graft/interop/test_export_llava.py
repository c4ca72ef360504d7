"""graft export --format hf-llava: transformers loads the checkpoint and gives graft's logits."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from graft.errors import GraftConfigError
from graft.interop.export_llava import export_llava, export_problems
from graft.inject import IMAGE_PLACEHOLDER
from tests.run_dirs import write_run_dir

MESSAGES = [{"role": "user", "content": "<image>\nWhat is shown in the image?"}]


def _image(seed=0, size=(50, 40)):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def _graft_logits(run_dir, images):
    from graft.model import GraftedModel
    from graft.template import encode_chat

    model = GraftedModel.from_run(run_dir)
    counts = [model.image_token_count(*im.size) for im in images]
    ids = torch.tensor([encode_chat(model.tokenizer, MESSAGES, counts,
                                    add_generation_prompt=True).input_ids])
    with torch.no_grad():
        logits = model.llm(inputs_embeds=model.embed(ids, model.image_features(images))).logits
    return ids, logits


def _hf_logits(out, images):
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    model = LlavaForConditionalGeneration.from_pretrained(str(out)).eval()
    processor = AutoProcessor.from_pretrained(str(out))
    text = processor.tokenizer.apply_chat_template(MESSAGES, tokenize=False,
                                                   add_generation_prompt=True)
    inputs = processor(text=text, images=images, return_tensors="pt")
    with torch.no_grad():
        return inputs["input_ids"], model(**inputs).logits


@pytest.mark.parametrize("family,tower,adapter,lora", [
    ("llama", "clip", {"kind": "mlp", "depth": 2}, False),
    ("qwen2", "siglip", {"kind": "linear"}, False),
    ("glm4", "clip-full", {"kind": "mlp", "depth": 2}, True),
    ("qwen3_moe", "siglip", {"kind": "mlp", "depth": 2}, False),
    ("glm4_moe", "clip", {"kind": "mlp", "depth": 2}, False),
], ids=["llama-clip-mlp", "qwen2-siglip-linear", "glm4-dual-clip-mlp-lora", "qwen3-moe-siglip-mlp",
        "glm4-moe-clip-mlp"])
def test_round_trip_matches_graft_logits(family, tower, adapter, lora, tiny_llm_factory,
                                         request, tmp_path):
    llm = tiny_llm_factory(family)
    path = request.getfixturevalue({"clip": "tiny_clip_dir", "siglip": "tiny_siglip_dir",
                                    "clip-full": "tiny_clip_full_dir"}[tower])
    tower = tower.removesuffix("-full")  # a full CLIPModel dir (text tower too) is a clip encoder
    feature_layer = -2 if tower == "clip" else -1
    run = write_run_dir(tmp_path / "run", llm, {"kind": tower, "path": str(path),
                                                "feature_layer": feature_layer}, adapter, lora=lora)
    summary = export_llava(run, tmp_path / "hf")
    assert summary["lora_merged"] is lora
    images = [_image()]
    ids, ours = _graft_logits(run, images)
    hf_ids, theirs = _hf_logits(tmp_path / "hf", images)
    expected_ids = ids.masked_fill(ids == IMAGE_PLACEHOLDER, summary["image_token_id"])
    assert hf_ids.tolist() == expected_ids.tolist()  # the Llava processor sizes the same runs
    vocab = ours.shape[-1]
    assert (theirs[..., :vocab] - ours).abs().max().item() <= 1e-4
    assert theirs[..., vocab:].abs().max().item() == 0  # the added <image> row never wins
    gen = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert gen["suppress_tokens"] == [summary["image_token_id"]]


def test_export_refuses_what_llava_cannot_express(tiny_llama, k25_dir, tmp_path):
    problems = export_problems({"kind": "moonvit", "path": str(k25_dir)},
                               {"kind": "mlp", "depth": 3, "layer_norm": True, "hidden_size": 7}, 64)
    text = " | ".join(problems)
    for needle in ("encoder.kind='moonvit'", "adapter.depth=3", "hidden_size=7", "pre-norm"):
        assert needle in text
    assert "pixel_shuffle" in export_problems({"kind": "clip", "path": "x"},
                                              {"kind": "pixel_shuffle"}, 64)[0]
    run = write_run_dir(tmp_path / "run", tiny_llama,
                        {"kind": "moonvit", "path": str(k25_dir), "feature_layer": -1},
                        {"kind": "mlp", "depth": 2, "layer_norm": True, "norm_chunks": 4})
    with pytest.raises(GraftConfigError, match="cannot export to hf-llava: encoder.kind='moonvit'"):
        export_llava(run, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_export_will_not_overwrite_foreign_dirs(tiny_llama, tiny_clip_dir, tmp_path):
    run = write_run_dir(tmp_path / "run", tiny_llama,
                        {"kind": "clip", "path": str(tiny_clip_dir)}, {"kind": "mlp"})
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(GraftConfigError, match="not written by graft"):
        export_llava(run, tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    export_llava(run, tmp_path / "out")
    export_llava(run, tmp_path / "out")  # a previous export may be replaced
