"""Checkpoint loading: sharded safetensors, RoPE scaling variants, clear errors."""

import json

import pytest
import torch

from graft.serving import Engine, EngineConfig, SamplingParams
from tests.serving.conftest import hf_greedy, make_prompts

ROPES = {
    "linear": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
               "rope_theta": 500000.0},
}


def _llama(tmp_path, name, shard=None, **overrides):
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
                      pad_token_id=0, **overrides)
    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08)
    out = tmp_path / name
    model.save_pretrained(out, max_shard_size=shard) if shard else model.save_pretrained(out)
    return out


@pytest.mark.parametrize("rope", sorted(ROPES))
def test_rope_variants_match_hf(tmp_path, rope):
    model_dir = _llama(tmp_path, rope, rope_parameters=ROPES[rope])
    engine = Engine.from_pretrained(model_dir, EngineConfig())
    prompts = make_prompts((70, 9), seed=40)  # past original_max_position_embeddings
    outs = engine.generate(prompt_token_ids=prompts,
                           sampling_params=SamplingParams(temperature=0.0, max_tokens=6))
    for p, o in zip(prompts, outs):
        assert o.token_ids == hf_greedy(model_dir, p, 6)


def test_sharded_checkpoint(tmp_path):
    model_dir = _llama(tmp_path, "sharded", shard="100KB")
    assert (model_dir / "model.safetensors.index.json").is_file()
    engine = Engine.from_pretrained(model_dir, EngineConfig())
    p = make_prompts((21,), seed=41)[0]
    out = engine.generate(prompt_token_ids=[p], sampling_params=SamplingParams(
        temperature=0.0, max_tokens=6))[0]
    assert out.token_ids == hf_greedy(model_dir, p, 6) and out.text == ""  # no tokenizer


def test_unsupported_rope_and_missing_tensor(tmp_path):
    model_dir = _llama(tmp_path, "dyn", rope_parameters={"rope_type": "dynamic", "factor": 2.0,
                                                         "rope_theta": 10000.0})
    with pytest.raises(ValueError, match="rope_type='dynamic'"):
        Engine.from_pretrained(model_dir)
    model_dir = _llama(tmp_path, "untied")
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg["num_hidden_layers"] = 3  # the checkpoint has only 2 layers
    (model_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="lacks"):
        Engine.from_pretrained(model_dir)
