"""Sampling settings: seeds, top-k/top-p, stop tokens and strings, eos, logprobs, streaming."""

import json
import shutil

import pytest

from graft.serving import Engine, EngineConfig, SamplingParams
from tests.serving.conftest import hf_greedy, make_prompts


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return Engine.from_pretrained(tiny_llama, EngineConfig())


def _gen(engine, prompts, params):
    return engine.generate(prompt_token_ids=prompts, sampling_params=params)


def test_seeded_sampling_is_batch_independent(engine):
    p = make_prompts((12,), seed=7)[0]
    seeded = SamplingParams(temperature=1.0, seed=123, max_tokens=16)
    alone = _gen(engine, [p], seeded)[0].token_ids
    others = [SamplingParams(temperature=0.8, max_tokens=10), seeded,
              SamplingParams(temperature=1.2, seed=5, max_tokens=16)]
    batch = _gen(engine, make_prompts((30,), seed=8) + [p, p], others)
    assert batch[1].token_ids == alone
    assert batch[2].token_ids != alone  # another seed, another draw


def test_top_k_one_and_tiny_top_p_are_greedy(engine):
    p = make_prompts((20,), seed=9)[0]
    greedy = _gen(engine, [p], SamplingParams(temperature=0.0, max_tokens=10))[0].token_ids
    k1 = _gen(engine, [p], SamplingParams(temperature=1.5, top_k=1, max_tokens=10))[0].token_ids
    p0 = _gen(engine, [p], SamplingParams(temperature=1.5, top_p=1e-6, max_tokens=10))[0].token_ids
    # 5e-324 is 0 in float32: the likeliest token stays anyway (it dropped every token, and a
    # guided request then sampled outside its grammar: a 500 schemathesis found)
    under = _gen(engine, [p], SamplingParams(temperature=1.5, top_p=5e-324, max_tokens=10))
    assert greedy == k1 == p0 == under[0].token_ids
    guided = _gen(engine, [p], SamplingParams(top_p=5e-324, max_tokens=10, guided_json=True))[0]
    assert guided.finish_reason != "internal_error" and guided.text.startswith("{")


def test_top_k_restricts_support(engine):
    p = make_prompts((6,), seed=10)[0]
    params = SamplingParams(temperature=5.0, top_k=3, logprobs=3, seed=1, max_tokens=12)
    out = _gen(engine, [p], params)[0]
    for token, lp in zip(out.token_ids, out.logprobs):
        top3 = sorted(lp, key=lp.get, reverse=True)[:3]
        assert token in top3


def test_min_p_keeps_only_tokens_near_the_likeliest():
    import torch

    from graft.serving.engine.sampler import Sampler

    class Seq:  # the sampler reads only seq.params
        def __init__(self, **kw):
            self.params = SamplingParams(**kw)

    # probabilities 0.5, 0.3, 0.15, 0.05: min_p 0.5 keeps those >= 0.25
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]] * 2))
    probs = Sampler.probs(logits, [Seq(temperature=1.0, min_p=0.5), Seq(temperature=1.0)])
    assert torch.allclose(probs[0], torch.tensor([0.625, 0.375, 0.0, 0.0]))
    assert torch.allclose(probs[1], torch.tensor([0.5, 0.3, 0.15, 0.05]))  # a neighbour: untouched


def test_min_p_one_is_greedy(engine):
    p = make_prompts((20,), seed=9)[0]
    greedy = _gen(engine, [p], SamplingParams(temperature=0.0, max_tokens=10))[0].token_ids
    m1 = _gen(engine, [p], SamplingParams(temperature=1.5, min_p=1.0, max_tokens=10))[0].token_ids
    assert greedy == m1


def test_stop_token_ids_and_max_tokens(engine):
    p = make_prompts((15,), seed=11)[0]
    base = _gen(engine, [p], SamplingParams(temperature=0.0, max_tokens=16))[0]
    assert len(base.token_ids) == 16 and base.finish_reason == "length"
    stop_tok = base.token_ids[5]
    first = base.token_ids.index(stop_tok)
    out = _gen(engine, [p], SamplingParams(temperature=0.0, max_tokens=16,
                                           stop_token_ids=[stop_tok]))[0]
    assert out.token_ids == base.token_ids[:first + 1] and out.finish_reason == "stop"


def test_stop_string_cuts_text(tiny_llama):
    engine = Engine.from_pretrained(tiny_llama, EngineConfig())
    prompt = engine.tokenizer("What is shown in the image?")["input_ids"]
    base = _gen(engine, [prompt], SamplingParams(temperature=0.0, max_tokens=24))[0]
    assert len(base.text) >= 6
    stop = base.text[4:6]
    cut = base.text.find(stop)
    out = _gen(engine, [prompt], SamplingParams(temperature=0.0, max_tokens=24, stop=stop))[0]
    assert out.finish_reason == "stop" and out.text == base.text[:cut]
    # the string prompt path tokenizes the same way
    by_text = engine.generate(prompts=["What is shown in the image?"],
                              sampling_params=SamplingParams(temperature=0.0, max_tokens=24))[0]
    assert by_text.token_ids == base.token_ids and by_text.text == base.text


def test_eos_and_ignore_eos(tiny_llama, tmp_path):
    p = make_prompts((9,), seed=12)[0]
    base = hf_greedy(tiny_llama, p, 14)
    eos = base[6]
    model_dir = tmp_path / "eos_model"
    shutil.copytree(tiny_llama, model_dir)
    gen_cfg = json.loads((model_dir / "generation_config.json").read_text())
    gen_cfg["eos_token_id"] = eos
    (model_dir / "generation_config.json").write_text(json.dumps(gen_cfg))
    engine = Engine.from_pretrained(model_dir, EngineConfig())
    out = _gen(engine, [p], SamplingParams(temperature=0.0, max_tokens=14))[0]
    assert out.token_ids == hf_greedy(model_dir, p, 14) == base[:base.index(eos) + 1]
    assert out.finish_reason == "stop"
    full = _gen(engine, [p], SamplingParams(temperature=0.0, max_tokens=14, ignore_eos=True))[0]
    assert full.token_ids == base and full.finish_reason == "length"


def test_greedy_logprobs(engine):
    out = _gen(engine, make_prompts((10,), seed=13),
               SamplingParams(temperature=0.0, max_tokens=5, logprobs=2))[0]
    assert len(out.logprobs) == 5
    for token, lp in zip(out.token_ids, out.logprobs):
        assert len(lp) == 2 and lp[token] == max(lp.values()) and lp[token] <= 0.0


def test_incremental_outputs_add_up(engine):
    prompts = make_prompts((7, 25), seed=14)
    params = SamplingParams(temperature=0.0, max_tokens=9, stop=["zzzz"])
    for i, p in enumerate(prompts):
        engine.add_request(f"s{i}", p, params)
    got = {"s0": ([], ""), "s1": ([], "")}
    final = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            toks, text = got[out.request_id]
            got[out.request_id] = (toks + out.new_token_ids, text + out.new_text)
            if out.finished:
                final[out.request_id] = out
    for rid, (toks, text) in got.items():
        assert toks == final[rid].token_ids and text == final[rid].text
    assert final["s1"].token_ids == hf_greedy(engine.model_dir, prompts[1], 9)


@pytest.mark.parametrize("field,kwargs", [
    ("max_tokens", dict(max_tokens=0)),
    ("max_tokens", dict(max_tokens=-3)),
    ("temperature", dict(temperature=-0.1)),
    ("top_p", dict(top_p=0.0)),
    ("top_p", dict(top_p=1.01)),
    ("min_p", dict(min_p=-0.1)),
    ("min_p", dict(min_p=1.5)),
])
def test_bad_sampling_params(field, kwargs):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_streamed_text_never_shows_the_stop_string(tiny_llama):
    engine = Engine.from_pretrained(tiny_llama, EngineConfig())
    prompt = engine.tokenizer("Describe the picture in one sentence.")["input_ids"]
    base = _gen(engine, [prompt], SamplingParams(temperature=0.0, max_tokens=24))[0].text
    stop = base[6:9]
    engine.add_request("s", prompt, SamplingParams(temperature=0.0, max_tokens=24, stop=[stop]))
    streamed, final = "", None
    while engine.has_unfinished_requests():
        for out in engine.step():
            streamed += out.new_text
            final = out
    assert final.finish_reason == "stop" and streamed == final.text == base[:base.find(stop)]
