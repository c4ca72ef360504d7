"""Bad input fails one request only; deadlines, EDF order, stats, KV sizing."""

import json
import shutil
import time

import pytest

from graft.serving import Engine, EngineConfig, SamplingParams
from tests.serving.conftest import hf_greedy, make_prompts

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


def test_prompt_over_context_fails_alone(tiny_llama):
    engine = Engine.from_pretrained(tiny_llama, EngineConfig(max_model_len=64))
    prompts = make_prompts((10, 65, 20), seed=20)
    outs = engine.generate(prompt_token_ids=prompts, sampling_params=GREEDY)
    assert outs[1].finish_reason == "error" and "max_model_len" in outs[1].error
    assert outs[1].token_ids == []
    for i in (0, 2):
        assert outs[i].token_ids == hf_greedy(tiny_llama, prompts[i], 8)


def test_generation_stops_at_context(tiny_llama):
    engine = Engine.from_pretrained(tiny_llama, EngineConfig(max_model_len=32))
    out = engine.generate(prompt_token_ids=make_prompts((28,), seed=21),
                          sampling_params=SamplingParams(temperature=0.0, max_tokens=50))[0]
    assert len(out.token_ids) == 4 and out.finish_reason == "length"


def test_bad_token_ids_and_empty_prompt(tiny_llama):
    engine = Engine.from_pretrained(tiny_llama, EngineConfig())
    outs = engine.generate(prompt_token_ids=[[1, 2, 10_000], [], [-200, 5], [4, 5, 6]],
                           sampling_params=GREEDY)
    assert [o.finish_reason for o in outs[:3]] == ["error"] * 3
    assert "vocabulary" in outs[0].error and "empty" in outs[1].error
    assert "mm_inputs" in outs[2].error
    assert outs[3].token_ids == hf_greedy(tiny_llama, [4, 5, 6], 8)
    with pytest.raises(ValueError, match="sampling_params"):
        engine.generate(prompt_token_ids=[[1], [2]], sampling_params=[GREEDY])


def test_unknown_architecture(tiny_llama, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(tiny_llama, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["architectures"] = ["FancyNewForCausalLM"]
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="architectures"):
        Engine.from_pretrained(bad)


def test_bad_engine_config():
    with pytest.raises(ValueError, match="block_size"):
        EngineConfig(block_size=0)
    with pytest.raises(ValueError, match="dtype"):
        EngineConfig(dtype="float8")


def test_deadline_and_edf_order(tiny_llama):
    engine = Engine.from_pretrained(tiny_llama, EngineConfig(max_num_seqs=1, num_kv_blocks=32))
    prompts = make_prompts((9, 9, 9), seed=22)
    engine.add_request("late", prompts[0], GREEDY)  # FCFS, no deadline
    engine.add_request("urgent", prompts[1], GREEDY, deadline=time.monotonic() + 3600)
    engine.add_request("expired", prompts[2], GREEDY, deadline=time.monotonic() - 1.0)
    first = engine.step()
    by_id = {o.request_id: o for o in first}
    assert by_id["expired"].finish_reason == "deadline" and by_id["expired"].finished
    assert "urgent" in by_id and "late" not in by_id  # earliest deadline admitted first
    stats = engine.stats()
    assert stats.num_running == 1 and stats.num_waiting == 1
    assert stats.queued_prefill_tokens == 9 and stats.total_kv_blocks == 32
    steps = 1
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    stats = engine.stats()
    # one cost model: every step is fitted into engine.cost, and stats() reads it
    c0, c1, c2 = engine.cost.coefficients
    assert engine.cost.observed == steps and engine.cost.fitted
    assert stats.free_kv_blocks == 32 and stats.prefill_seconds_per_token == c1
    assert stats.decode_step_seconds == c0 + c2


def test_running_request_past_deadline_frees_blocks(tiny_llama):
    engine = Engine.from_pretrained(tiny_llama, EngineConfig(num_kv_blocks=16))
    engine.add_request("r", make_prompts((20,), seed=23)[0],
                       SamplingParams(temperature=0.0, max_tokens=100),
                       deadline=time.monotonic() + 3600)
    engine.step()
    engine.seqs["r"].deadline = time.monotonic() - 1.0  # time passes
    out = engine.step()
    assert out[0].finish_reason == "deadline" and out[0].finished
    assert engine.block_manager.num_free_blocks == 16


def test_kv_cache_sizing(tiny_llama):
    by_mem = Engine.from_pretrained(tiny_llama, EngineConfig(kv_cache_memory=1 << 20))
    per_block = by_mem.runner.bytes_per_block()
    assert by_mem.block_manager.num_blocks == (1 << 20) // per_block
    default = Engine.from_pretrained(tiny_llama)
    assert default.block_manager.num_blocks == 64 * (512 // 16)  # max_num_seqs full contexts


def test_generate_type_error_leaves_nothing_queued(tiny_llama):
    engine = Engine.from_pretrained(tiny_llama, EngineConfig())
    with pytest.raises(ValueError, match="prompt_token_ids"):
        engine.generate(prompt_token_ids=[[1, 2, 3], [4, "x"]], sampling_params=GREEDY)
    assert not engine.has_unfinished_requests()


def test_from_pretrained_expands_the_home_dir(tiny_llama, monkeypatch):
    # docs/engine.md's Engine.from_pretrained("~/models/...") works as written
    monkeypatch.setenv("HOME", str(tiny_llama.parent))
    engine = Engine.from_pretrained(f"~/{tiny_llama.name}")
    prompt = make_prompts((6,), seed=3)
    assert engine.generate(prompt_token_ids=prompt, sampling_params=GREEDY)[0].token_ids \
        == hf_greedy(tiny_llama, prompt[0], 8)
