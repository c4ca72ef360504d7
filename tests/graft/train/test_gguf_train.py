"""A projector trained over a GGUF file's LLM (the dir `graft models gguf` makes: HF reads the
file dequantized, as `from_pretrained(gguf_file=...)`), then served with the file's Q4 linears
held exactly (graft.gguf_llm)."""

import pytest
import torch

from graft.gguf_llm import gguf_llm_dir
from graft.train.loop import train
from tests.gguf_files import write_gguf
from tests.graft.train.test_train import losses

pytest.importorskip("gguf")


def test_train_and_serve_over_a_gguf_llm(make_spec, tiny_llama, tmp_path, monkeypatch):
    from graft.serving import Engine, EngineConfig

    monkeypatch.setenv("GRAFT_GGUF_CACHE", str(tmp_path / "cache"))
    file = write_gguf(tiny_llama, tmp_path / "tiny.gguf",
                      {k: "Q4_1" for k in ("q_proj", "k_proj", "v_proj", "o_proj",
                                           "gate_proj", "up_proj", "down_proj")})
    spec = make_spec(llm=gguf_llm_dir(file), max_steps=3)
    run = train(spec)
    assert len(losses(run)) == 3 and all(torch.isfinite(torch.tensor(losses(run))))
    engine = Engine.from_pretrained(run, EngineConfig(num_kv_blocks=32))
    plan = engine.runner.quant_plan
    assert sum(s.name == "int4-g32" for s in plan.values()) == len(plan) - 1  # all but the head


def test_a_run_over_a_gguf_llm_exports_to_llava(tiny_llama, tiny_clip_dir, tmp_path, monkeypatch):
    from graft.interop.export_llava import export_llava
    from tests.graft.interop.test_export_llava import _graft_logits, _hf_logits, _image
    from tests.run_dirs import write_run_dir

    monkeypatch.setenv("GRAFT_GGUF_CACHE", str(tmp_path / "cache"))
    llm = gguf_llm_dir(write_gguf(tiny_llama, tmp_path / "tiny.gguf", {"q_proj": "Q4_0", "up_proj": "Q4_1"}))
    run = write_run_dir(tmp_path / "run", llm, {"kind": "clip", "path": str(tiny_clip_dir),
                                                "feature_layer": -2}, {"kind": "mlp", "depth": 2})
    export_llava(run, tmp_path / "hf")  # the LLM written dequantized, as transformers reads it
    _, ours = _graft_logits(run, [_image()])
    _, theirs = _hf_logits(tmp_path / "hf", [_image()])
    assert (theirs[..., :ours.shape[-1]] - ours).abs().max().item() <= 1e-4
