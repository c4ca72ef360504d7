"""Random mixed workloads through Engine.step, seeded: each engine config (block size, a pool
small enough to preempt, prefix caching, chunked prefill, speculation, int8/int4 weights,
bf16 activations, bf16/int8 KV) takes requests that share prefixes or repeat themselves,
with greedy and seeded sampling, stop ids, penalties, logit bias, min_tokens, logprobs,
guided regex/choice, arriving between steps, some aborted. Every request that finishes must
give exactly the tokens and finish reason it gives alone in the same config, and no KV block
may stay in use. Sampled requests run without speculation: with it their tokens depend on
the batch by design (docs/engine.md, "Speculative decoding")."""

import random

import pytest

from graft.serving import Engine, EngineConfig, SamplingParams
from tests.serving.conftest import drain, mixed_arrivals

VOCAB = 384


def _params(rng: random.Random) -> SamplingParams:
    kw = dict(max_tokens=rng.choice([1, 2, 5, 17, 40]), ignore_eos=rng.random() < 0.7)
    if rng.random() < 0.4:
        kw.update(temperature=rng.choice([0.7, 1.0]), seed=rng.randrange(1 << 30),
                  top_p=rng.choice([1.0, 0.9]), top_k=rng.choice([0, 20]), speculative="off")
    else:
        kw.update(temperature=0.0)
        if rng.random() < 0.3:
            kw["speculative"] = rng.choice(["off", "ngram", "suffix"])
    if rng.random() < 0.2:
        kw["stop_token_ids"] = [rng.randrange(3, VOCAB)]
    if rng.random() < 0.2:
        kw["repetition_penalty"] = 1.3
    if rng.random() < 0.1:
        kw.update(presence_penalty=1.0, frequency_penalty=0.5)
    if rng.random() < 0.1:
        kw["logit_bias"] = {rng.randrange(3, VOCAB): 5.0}
    if rng.random() < 0.2:
        kw["min_tokens"] = min(3, kw["max_tokens"])
    if rng.random() < 0.2:
        kw["logprobs"] = 2
    if rng.random() < 0.1:
        kw["prompt_logprobs"] = 1
    if rng.random() < 0.1:
        kw["guided_regex"] = "[a-c]{2,6}"
    elif rng.random() < 0.1:
        kw["guided_choice"] = ["yes", "no", "maybe so"]
    return SamplingParams(**kw)


def _prompts(rng: random.Random, n: int) -> list[list[int]]:
    base = [rng.randrange(3, VOCAB) for _ in range(rng.choice([4, 16, 33, 70]))]
    out = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.4:  # a shared prefix, then its own tokens
            tail = [rng.randrange(3, VOCAB) for _ in range(rng.randrange(0, 30))]
            out.append(base[:rng.randrange(1, len(base) + 1)] + tail)
        elif kind < 0.6:  # repeats itself: n-gram and suffix proposals find matches
            out.append((base * 3)[:rng.randrange(5, 3 * len(base))])
        else:
            out.append([rng.randrange(3, VOCAB) for _ in range(rng.randrange(1, 120))])
    return out


def _config(rng: random.Random) -> EngineConfig:
    return EngineConfig(block_size=rng.choice([4, 16]), num_kv_blocks=rng.choice([12, 24, 64]),
                        max_num_seqs=rng.choice([2, 4, 16]),
                        max_num_batched_tokens=rng.choice([16, 64, 256]),
                        enable_prefix_caching=rng.random() < 0.7, max_model_len=256,
                        speculative=rng.choice(["off", "ngram", "suffix"]),
                        quantization=rng.choice([None, None, "int8", "int4"]),
                        kv_cache_dtype=rng.choice(["auto", "auto", "bfloat16", "int8"]),
                        dtype=rng.choice(["float32", "float32", "bfloat16"]))


def _alone(model_dir, config, prompt, params):
    engine = Engine.from_pretrained(model_dir, config)
    engine.add_request("alone", prompt_token_ids=prompt, sampling_params=params)
    return drain(engine)["alone"]


@pytest.mark.parametrize("seed", range(24))  # pools of 48 to 1024 tokens, 4 to 12 requests
def test_each_request_answers_as_alone_and_no_block_stays_used(tiny_llama, seed):
    rng, arrivals = random.Random(seed), random.Random(seed + 1)
    config = _config(rng)
    n = rng.randrange(4, 13)
    prompts, params = _prompts(rng, n), [_params(rng) for _ in range(n)]
    engine = Engine.from_pretrained(tiny_llama, config)

    def submit(i):
        engine.add_request(f"r{i}", prompt_token_ids=prompts[i], sampling_params=params[i])

    done, aborted = mixed_arrivals(engine, submit, n, arrivals)
    assert engine.kv_usage()[0] == 0, (config, engine.kv_usage())
    assert set(done) | aborted == {f"r{i}" for i in range(n)}
    for rid, out in done.items():
        i = int(rid[1:])
        want = _alone(tiny_llama, config, prompts[i], params[i])
        assert (out.finish_reason, out.token_ids) == (want.finish_reason, want.token_ids), (
            config, params[i], len(prompts[i]))
