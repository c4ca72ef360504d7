"""graft export --format vllm: the dir's layout, its weight-free image token counts against the
real encoder + projector for every encoder/projector kind, LoRA merging, and what it refuses.
vLLM itself runs on these exports in tests/serving/vllm_plugin (its own venv)."""

import json
from pathlib import Path

import pytest
import torch

from graft.digests import weights_sha256
from graft.errors import GraftConfigError
from graft.interop.export_vllm import export_vllm
from graft.serving.vllm_plugin.geometry import ImageTokenCounter
from tests.run_dirs import write_run_dir

SIZES = [(37, 23), (23, 37), (64, 64), (90, 40), (640, 480)]


def _files(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_layout_tokenizer_and_sources_untouched(tiny_llama, tiny_siglip_dir, tmp_path):
    from transformers import AutoTokenizer

    from graft.template import encode_chat

    run = write_run_dir(tmp_path / "run", tiny_llama, {"kind": "siglip", "path": tiny_siglip_dir},
                        {"kind": "pixel_shuffle", "ratio": 2})
    sources = {p: _files(p) for p in (tiny_llama, run, Path(tiny_siglip_dir))}
    out = tmp_path / "export"
    summary = export_vllm(run, out)

    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["GraftForConditionalGeneration"]
    assert config["model_type"] == "llama" and config["dtype"] == "float32"
    meta = config["graft"]
    assert meta["text_architectures"] == ["LlamaForCausalLM"]
    assert meta["token_grid"] == [4, 4] and meta["prefix_tokens"] == 0
    assert weights_sha256(out) == weights_sha256(tiny_llama)  # the LLM's own tensors
    assert (out / "graft" / "encoder" / "model.safetensors").read_bytes() == \
        (Path(tiny_siglip_dir) / "model.safetensors").read_bytes()
    assert summary["lora_merged"] is False
    for path, files in sources.items():
        assert _files(path) == files, f"{path} changed"

    # `<image>` is one id; the text around it tokenizes as graft's pieces (one prompt, two ids sets)
    tok = AutoTokenizer.from_pretrained(str(out))
    assert meta["image_token_id"] == tok.convert_tokens_to_ids("<image>") >= len(
        AutoTokenizer.from_pretrained(str(tiny_llama)))
    messages = [{"role": "user", "content": "Compare <image> with\n<image>, please."}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    graft_ids = encode_chat(AutoTokenizer.from_pretrained(str(tiny_llama)), messages, [1, 1],
                            add_generation_prompt=True).input_ids
    assert tok(text, add_special_tokens=False)["input_ids"] == [
        meta["image_token_id"] if t < 0 else t for t in graft_ids]
    # content parts (what vLLM's chat API hands the template) render to the same text
    parts = [{"role": "user", "content": [{"type": "text", "text": "Compare"}, {"type": "image"},
                                          {"type": "text", "text": "with"}, {"type": "image"}]}]
    assert tok.apply_chat_template(parts, tokenize=False, add_generation_prompt=True) == \
        tok.apply_chat_template([{"role": "user", "content": "Compare\n<image>\nwith\n<image>"}],
                                tokenize=False, add_generation_prompt=True)


@pytest.mark.parametrize("family,arch", [("qwen3_moe", "Qwen3MoeForCausalLM"),
                                         ("glm4_moe", "Glm4MoeForCausalLM")])
def test_moe_llm_keeps_its_own_config_for_vllm(family, arch, tiny_llm_factory, tiny_siglip_dir,
                                              tmp_path):
    """vLLM builds its own MoE implementation from the LLM's config: experts and router fields
    pass through untouched, and the per-expert tensors are the LLM's own."""
    llm = tiny_llm_factory(family)
    run = write_run_dir(tmp_path / "run", llm, {"kind": "siglip", "path": tiny_siglip_dir},
                        {"kind": "mlp", "depth": 2})
    export_vllm(run, tmp_path / "export")
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    source = json.loads((llm / "config.json").read_text())
    assert config["graft"]["text_architectures"] == [arch] and config["model_type"] == family
    for key in ("num_experts_per_tok", "moe_intermediate_size", "n_group", "num_experts",
                "routed_scaling_factor", "first_k_dense_replace"):
        assert config.get(key) == source.get(key)
    assert weights_sha256(tmp_path / "export") == weights_sha256(llm)


@pytest.mark.parametrize("encoder,adapter", [
    ("siglip", {"kind": "pixel_shuffle", "ratio": 2}),
    ("clip-keep-cls", {"kind": "mlp", "depth": 2}),
    ("timm_vit", {"kind": "resampler", "num_queries": 5, "num_heads": 2}),
    ("timm_cnn", {"kind": "linear"}),
    ("moonvit", {"kind": "pixel_shuffle", "ratio": 2}),
])
def test_weight_free_counts_equal_the_encoder(encoder, adapter, tiny_llama, tiny_encoder_config,
                                              request, tmp_path):
    from graft.image_path import ImagePath
    from graft.spec import GraftSpec

    if encoder == "moonvit":
        cfg = {"kind": "moonvit", "path": str(request.getfixturevalue("k25_dir")), "feature_layer": -1}
    elif encoder == "clip-keep-cls":
        cfg = tiny_encoder_config("clip", drop_prefix=False).to_dict()
    else:
        cfg = tiny_encoder_config(encoder).to_dict()
    run = write_run_dir(tmp_path / "run", tiny_llama, cfg, adapter)
    export_vllm(run, tmp_path / "export")  # checks the counts itself; check them here too
    spec = GraftSpec.load(run / "graft.yaml")
    image_path = ImagePath.from_spec(spec, 64, run)
    counter = ImageTokenCounter.from_export(tmp_path / "export")
    counts = [counter(w, h) for w, h in SIZES]
    assert counts == [image_path.image_token_count(w, h) for w, h in SIZES]
    assert all(p.device.type == "meta" for p in counter.projector.parameters())
    # fixed-resolution towers: one count; MoonViT follows the image size
    assert (len(set(counts)) > 1) == (encoder == "moonvit")


def test_lora_run_is_merged(tiny_llm_factory, tiny_clip_dir, tmp_path):
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    llm_dir = tiny_llm_factory("qwen2")
    run = write_run_dir(tmp_path / "run", llm_dir, {"kind": "clip", "path": tiny_clip_dir},
                        {"kind": "mlp", "depth": 2}, lora=True)
    summary = export_vllm(run, tmp_path / "export")
    assert summary["lora_merged"] is True
    got = load_file(str(tmp_path / "export" / "model.safetensors"))
    merged = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(llm_dir)),
                                       str(run / "lora")).merge_and_unload().state_dict()
    assert set(got) == set(merged)
    for name, tensor in merged.items():
        torch.testing.assert_close(got[name], tensor, rtol=0, atol=0, msg=name)
    base = load_file(str(llm_dir / "model.safetensors"))
    assert not torch.equal(got["model.layers.0.self_attn.q_proj.weight"],
                           base["model.layers.0.self_attn.q_proj.weight"])
    graft_yaml = (tmp_path / "export" / "graft" / "graft.yaml").read_text()
    assert "sha256" not in graft_yaml  # the merged weights are not the ones trained against


def test_refuses_a_dir_it_did_not_write_and_replaces_its_own(tiny_llama, tiny_siglip_dir, tmp_path):
    run = write_run_dir(tmp_path / "run", tiny_llama, {"kind": "siglip", "path": tiny_siglip_dir},
                        {"kind": "linear"})
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(GraftConfigError, match="not written by graft"):
        export_vllm(run, other)
    assert (other / "notes.txt").read_text() == "mine"
    out = tmp_path / "export"
    export_vllm(run, out)
    export_vllm(run, out)  # a previous export is replaced whole
    assert json.loads((out / "graft_export.json").read_text())["format"] == "vllm"


def test_cli_format_vllm(tiny_llama, tiny_siglip_dir, tmp_path, capsys):
    from graft.cli import main

    run = write_run_dir(tmp_path / "run", tiny_llama, {"kind": "siglip", "path": tiny_siglip_dir},
                        {"kind": "linear"})
    assert main(["export", str(run), str(tmp_path / "out"), "--format", "vllm"]) == 0
    assert json.loads(capsys.readouterr().out)["format"] == "vllm"


def test_plugin_imports_without_vllm():
    import importlib.util

    import graft.serving.vllm_plugin as plugin

    assert plugin.ARCHITECTURE == "GraftForConditionalGeneration"
    if importlib.util.find_spec("vllm") is None:  # graft's own venv: register needs vLLM
        with pytest.raises(ImportError):
            plugin.register()
