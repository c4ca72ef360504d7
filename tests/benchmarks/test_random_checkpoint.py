"""`graft models random`: real models' shapes with random weights, loadable by graft's engine
and transformers, written atomically and never over a user's files."""

import json

import pytest
import torch

from graft.benchmarks.random_checkpoint import random_config
from graft.cli import main


@pytest.mark.parametrize("shape, parameters", [
    ("qwen2.5-1.5b", 1_543_714_304),  # the published model's count (tied embeddings)
    ("smollm2-135m", 134_515_008),
    ("qwen3-moe-bench", 228_730_368),  # docs/benchmarks.md "MoE LLMs"
])
def test_shapes_have_the_published_parameter_counts(shape, parameters):
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(random_config(shape))
    assert sum(p.numel() for p in model.parameters()) == parameters


def test_a_one_layer_moe_checkpoint_loads_and_generates(tmp_path, capsys):
    from transformers import AutoConfig, AutoTokenizer

    from graft.serving import Engine, EngineConfig, SamplingParams

    out = tmp_path / "moe"
    assert main(["models", "random", "qwen3-moe-bench", str(out), "--layers", "1"]) == 0
    assert str(out) in capsys.readouterr().out
    cfg = AutoConfig.from_pretrained(out)
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.hidden_size, cfg.num_experts) == (
        "qwen3_moe", 1, 1024, 32)
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    tok = AutoTokenizer.from_pretrained(out)
    prompt = tok(tok.apply_chat_template([{"role": "user", "content": "hello"}], tokenize=False,
                                         add_generation_prompt=True))["input_ids"]
    assert max(prompt) < cfg.vocab_size and tok.eos_token_id == cfg.eos_token_id
    engine = Engine.from_pretrained(out, EngineConfig(num_kv_blocks=16, quantization="int8"))
    done = engine.generate(prompt_token_ids=[prompt], sampling_params=SamplingParams(
        temperature=0.0, max_tokens=4, ignore_eos=True))[0]
    assert len(done.token_ids) == 4
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dir left


def test_a_non_empty_out_is_refused_and_kept(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    assert main(["models", "random", "smollm2-135m", str(out)]) != 0
    err = capsys.readouterr().err
    assert "is not an empty dir" in err and len(err.strip().splitlines()) == 1
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


@pytest.mark.parametrize("layers", ["0", "31", "999"])
def test_layers_outside_the_shapes_count_are_refused(tmp_path, capsys, layers):
    # smollm2-135m has 30 layers: --layers keeps some of them, it never builds more
    assert main(["models", "random", "smollm2-135m", str(tmp_path / "x"), "--layers", layers]) != 0
    err = capsys.readouterr().err
    assert f"--layers {layers}: smollm2-135m has 30 decoder layers; use 1 to 30" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "x").exists()
