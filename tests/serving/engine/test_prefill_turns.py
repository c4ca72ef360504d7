"""max_prefill_tokens: prompts that arrive together are prefilled in turns of about that many
tokens (the crossing prompt whole), so the first ones answer sooner; tokens stay HF's. A server
on CPU does so by default, an offline engine runs one step."""

import dataclasses

from graft.serving import Engine, EngineConfig, SamplingParams
from graft.serving.engine.step_cost import StepCostModel
from tests.serving.conftest import hf_greedy, make_prompts

GREEDY = SamplingParams(temperature=0.0, max_tokens=6)


def _add(engine, prompts):
    for i, p in enumerate(prompts):
        engine.add_request(str(i), prompt_token_ids=p, sampling_params=GREEDY)


def _steps(engine, n):
    """The tokens per sequence of the engine's next n steps."""
    seen, schedule = [], engine.scheduler.schedule

    def recording(*args, **kwargs):
        batch, finished = schedule(*args, **kwargs)
        seen.append(batch.num_tokens)
        return batch, finished

    engine.scheduler.schedule = recording
    for _ in range(n):
        engine.step()
    return seen


def test_a_wave_of_prompts_is_admitted_in_turns(tiny_llama):
    engine = Engine.from_pretrained(tiny_llama, EngineConfig(max_prefill_tokens=64))
    _add(engine, make_prompts([30] * 6, seed=1))
    # 60 < 64 admits the third prompt, whole; then none until the next step, beside the decodes
    assert _steps(engine, 2) == [[30, 30, 30], [1, 1, 1, 30, 30, 30]]


def test_a_long_prompt_still_runs_in_one_step(tiny_llama):
    engine = Engine.from_pretrained(tiny_llama, EngineConfig(max_prefill_tokens=16))
    _add(engine, make_prompts([200, 5], seed=2))
    assert _steps(engine, 1) == [[200]]  # the step budget (2048), not the cap, chunks a prompt


def test_tokens_equal_hf_when_prefill_comes_in_turns(tiny_llama):
    engine = Engine.from_pretrained(tiny_llama, EngineConfig(max_prefill_tokens=20,
                                                             max_num_batched_tokens=48))
    prompts = make_prompts((5, 17, 40, 33, 1, 16, 60), seed=3)
    outs = engine.generate(prompt_token_ids=prompts, sampling_params=GREEDY)
    for i, (p, o) in enumerate(zip(prompts, outs)):
        assert o.token_ids == hf_greedy(tiny_llama, p, GREEDY.max_tokens), f"prompt {i}"


def test_a_server_on_cpu_prefills_in_turns_an_offline_engine_in_one_step(tiny_llama):
    import argparse

    from graft.serving.http import serve_cli

    assert EngineConfig().step_prefill_tokens == 2048  # offline: the step budget
    assert dataclasses.replace(EngineConfig(), max_num_batched_tokens=4096).step_prefill_tokens == 4096
    assert EngineConfig.for_serving().step_prefill_tokens == 256
    assert EngineConfig.for_serving(device="cuda", max_num_batched_tokens=4096).step_prefill_tokens == 4096
    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    for flags, want in (([], 256), (["--max-prefill-tokens", "1024"], 1024)):
        app = serve_cli.build(parser.parse_args([str(tiny_llama), "--num-kv-blocks", "16", *flags]))
        assert app.state.ctx.engine.config.step_prefill_tokens == want


def test_latency_estimate_counts_the_turns():
    cost = StepCostModel()
    c0, c1, c2 = cost.coefficients
    # 600 prompt tokens, 4 decoding: 1 step under the budget alone, 3 steps at 256 a step
    assert cost.prefill_seconds(600, 4, 2048) == (c0 + 4 * c2) + 600 * c1
    assert cost.prefill_seconds(600, 4, 2048, 256) == 3 * (c0 + 4 * c2) + 600 * c1
