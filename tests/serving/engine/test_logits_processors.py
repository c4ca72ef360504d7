"""logit_bias, min_tokens, the repetition / frequency / presence penalties, allowed_token_ids
and bad words: greedy tokens equal HF generate with the same logits processor, batched with other settings, with and
without speculative decoding."""

import json
import shutil

import pytest
import torch

from graft.serving import Engine, EngineConfig, SamplingParams
from tests.serving.conftest import make_prompts
from tests.serving.engine.test_spec_decode import OracleProposer

MAX_NEW = 16


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return Engine.from_pretrained(tiny_llama, EngineConfig(num_kv_blocks=64))


@pytest.fixture(scope="module")
def hf_model(tiny_llama):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()


class OpenAIPenalties:
    """frequency / presence penalties as OpenAI defines them, as an HF LogitsProcessor:
    over the generated tokens only."""

    def __init__(self, prompt_len, frequency, presence):
        self.prompt_len, self.frequency, self.presence = prompt_len, frequency, presence

    def __call__(self, input_ids, scores):
        out = input_ids[:, self.prompt_len:]
        ones = torch.ones_like(out, dtype=scores.dtype)
        counts = torch.zeros_like(scores).scatter_add_(1, out, ones)  # [1, V]
        return scores - self.frequency * counts - self.presence * (counts > 0).to(scores.dtype)


def hf_generate(model, prompt, max_new=MAX_NEW, processors=(), **kwargs):
    from transformers import LogitsProcessorList

    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                             do_sample=False, logits_processor=LogitsProcessorList(processors),
                             **kwargs)
    return out[0, len(prompt):].tolist()


def _case(engine, prompt, kind):
    """(SamplingParams, HF generate kwargs) for one processor."""
    plain = engine.generate(prompt_token_ids=[prompt], sampling_params=SamplingParams(
        temperature=0.0, max_tokens=MAX_NEW))[0].token_ids
    if kind == "repetition":
        return dict(repetition_penalty=1.3), dict(repetition_penalty=1.3)
    if kind == "repetition_below_one":
        return dict(repetition_penalty=0.7), dict(repetition_penalty=0.7)
    if kind == "bias":  # push the plain answer's first token down, a late one up
        bias = {plain[0]: -4.0, plain[-1]: 2.5}
        return dict(logit_bias=bias), dict(sequence_bias=[[[t], b] for t, b in bias.items()])
    if kind == "frequency":
        return (dict(frequency_penalty=1.2),
                dict(processors=[OpenAIPenalties(len(prompt), 1.2, 0.0)]))
    if kind == "presence":
        return (dict(presence_penalty=1.5, frequency_penalty=-0.3),
                dict(processors=[OpenAIPenalties(len(prompt), -0.3, 1.5)]))
    if kind == "allowed":  # every third id, the plain answer's first token left out
        allowed = [t for t in range(0, 384, 3) if t != plain[0]]
        return dict(allowed_token_ids=allowed), dict(prefix_allowed_tokens_fn=lambda b, i: allowed)
    if kind == "bad_words":  # the plain answer's opening pair, and a later token anywhere
        words = [[plain[0], plain[1]], [plain[3]]]
        return dict(bad_words_token_ids=words), dict(bad_words_ids=words)
    raise ValueError(kind)


KINDS = ("repetition", "repetition_below_one", "bias", "frequency", "presence", "allowed",
         "bad_words")


def test_batched_processors_match_hf_generate(engine, hf_model):
    prompts = make_prompts((9, 23, 14, 31, 6, 17, 11), seed=21)
    cases = [_case(engine, p, kind) for p, kind in zip(prompts, KINDS)]
    plain = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
    # one batch: every processor plus a plain row, each row with its own settings
    params = [SamplingParams(temperature=0.0, max_tokens=MAX_NEW, **ours) for ours, _ in cases]
    outs = engine.generate(prompt_token_ids=prompts + [prompts[0]],
                           sampling_params=params + [plain])
    for prompt, (_, theirs), out, kind in zip(prompts, cases, outs, KINDS):
        assert out.token_ids == hf_generate(hf_model, prompt, **theirs), kind
    assert outs[-1].token_ids == hf_generate(hf_model, prompts[0])
    # each processor changed something (else the parity above shows nothing)
    for prompt, out, kind in zip(prompts, outs, KINDS):
        assert out.token_ids != hf_generate(hf_model, prompt), kind


def test_min_tokens_holds_back_eos_as_hf(tiny_llama, tmp_path, hf_model):
    from transformers import AutoModelForCausalLM

    prompt = make_prompts((9,), seed=12)[0]
    base = hf_generate(hf_model, prompt)
    eos = base[4]
    model_dir = tmp_path / "eos_model"  # the same weights; a token greedy decoding emits is eos
    shutil.copytree(tiny_llama, model_dir)
    gen_cfg = json.loads((model_dir / "generation_config.json").read_text())
    gen_cfg["eos_token_id"] = eos
    (model_dir / "generation_config.json").write_text(json.dumps(gen_cfg))
    engine = Engine.from_pretrained(model_dir, EngineConfig(num_kv_blocks=32))
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    stopped = engine.generate(prompt_token_ids=[prompt], sampling_params=SamplingParams(
        temperature=0.0, max_tokens=MAX_NEW))[0]
    assert stopped.token_ids == base[:base.index(eos) + 1] and stopped.finish_reason == "stop"
    held = engine.generate(prompt_token_ids=[prompt], sampling_params=SamplingParams(
        temperature=0.0, max_tokens=MAX_NEW, min_tokens=8))[0]
    assert held.token_ids == hf_generate(hf, prompt, min_new_tokens=8)
    assert len(held.token_ids) > 8 and eos not in held.token_ids[:8]
    # a stop token id is held back the same way
    stop = base[2]
    out = engine.generate(prompt_token_ids=[prompt], sampling_params=SamplingParams(
        temperature=0.0, max_tokens=MAX_NEW, stop_token_ids=[stop], min_tokens=5))[0]
    assert stop not in out.token_ids[:5] and len(out.token_ids) > 3


def test_processors_are_identical_under_speculation(tiny_llama, engine):
    """Verify rows see the proposals before them as generated: penalties count them, and
    min_tokens counts them, so speculation changes no token."""
    prompts = make_prompts((12, 20, 7), seed=5)
    prompts.append(prompts[-1] + prompts[-1])  # repeats itself: prompt lookup proposes at once
    params = [SamplingParams(temperature=0.0, max_tokens=MAX_NEW, repetition_penalty=1.2),
              SamplingParams(temperature=0.0, max_tokens=MAX_NEW, frequency_penalty=0.8,
                             presence_penalty=0.3, logit_bias={7: 1.5}),
              SamplingParams(temperature=0.0, max_tokens=MAX_NEW, min_tokens=10,
                             repetition_penalty=1.1),
              SamplingParams(temperature=1.0, seed=3, max_tokens=MAX_NEW, frequency_penalty=0.5)]
    want = [o.token_ids for o in engine.generate(prompt_token_ids=prompts, sampling_params=params)]
    spec = Engine.from_pretrained(tiny_llama, EngineConfig(num_kv_blocks=64, speculative="ngram"))
    spec.spec.ngram = OracleProposer(prompts, want)  # right twice, then wrong, at every offset
    got = spec.generate(prompt_token_ids=prompts, sampling_params=params)
    assert [o.token_ids for o in got[:3]] == want[:3]
    assert spec.stats().spec_accepted_tokens > 0 and spec.stats().spec_verify_steps > 0


@pytest.mark.parametrize("field,kwargs", [
    ("logit_bias", dict(logit_bias={3: 101})),
    ("logit_bias", dict(logit_bias={"3": 1.0})),
    ("logit_bias", dict(logit_bias={3: float("nan")})),
    ("logit_bias", dict(logit_bias=[3, 1.0])),
    ("presence_penalty", dict(presence_penalty=2.5)),
    ("frequency_penalty", dict(frequency_penalty=-2.1)),
    ("repetition_penalty", dict(repetition_penalty=0.0)),
    ("repetition_penalty", dict(repetition_penalty=True)),
    ("min_tokens", dict(min_tokens=-1)),
    ("min_tokens", dict(min_tokens=17, max_tokens=16)),
    ("allowed_token_ids", dict(allowed_token_ids=[])),
    ("allowed_token_ids", dict(allowed_token_ids=[-1])),
    ("bad_words_token_ids", dict(bad_words_token_ids=[[]])),
    ("bad_words_token_ids", dict(bad_words_token_ids=[3])),
])
def test_bad_processor_settings_name_the_field(field, kwargs):
    with pytest.raises(ValueError, match=f"SamplingParams.{field}") as err:
        SamplingParams(**kwargs)
    assert "\n" not in str(err.value)


def test_logit_bias_outside_the_vocabulary_is_refused(engine):
    with pytest.raises(ValueError, match=r"logit_bias names token id 384, outside .*\[0, 384\)"):
        engine.add_request("r", [1, 2, 3], SamplingParams(logit_bias={384: 1.0}))
    assert not engine.has_unfinished_requests()


def test_a_tiny_repetition_penalty_stays_finite():
    """r near 0 divides positive logits past the float range: they stay the largest finite,
    so the distribution sampled from has no NaN."""
    from graft.serving.engine.logits_processors import process_logits
    from graft.serving.engine.sampler import Sampler
    from graft.serving.engine.sequence import Sequence

    params = SamplingParams(temperature=1.0, repetition_penalty=1e-300)
    seq = Sequence("r", [3, 5, 7], params, 0)
    logits = torch.randn(1, 16)
    logits[0, [3, 5]] = torch.tensor([2.0, 1.0])
    out = process_logits(logits, [(seq, [])], set())
    assert out[0, 3] == out[0, 5] == torch.finfo(torch.float32).max
    assert torch.isfinite(Sampler.probs(out, [seq])).all()


def test_allowed_tokens_win_over_min_tokens_and_none_left_is_that_requests_error(engine):
    eos = engine.tokenizer.eos_token_id
    prompts = make_prompts((7, 9), seed=4)
    only_eos = SamplingParams(temperature=0.0, max_tokens=4, allowed_token_ids=[eos], min_tokens=2)
    nothing = SamplingParams(temperature=0.0, max_tokens=4, allowed_token_ids=[5, 6],
                             bad_words_token_ids=[[5], [6]])
    plain = SamplingParams(temperature=0.0, max_tokens=4)
    outs = engine.generate(prompt_token_ids=prompts + [prompts[1]],
                           sampling_params=[only_eos, nothing, plain])
    assert (outs[0].token_ids, outs[0].finish_reason) == ([eos], "stop")
    assert outs[1].finish_reason == "error" and outs[1].token_ids == []
    assert outs[1].error.startswith("allowed_token_ids and bad_words leave no token to sample")
    alone = engine.generate(prompt_token_ids=[prompts[1]], sampling_params=plain)[0]
    assert outs[2].token_ids == alone.token_ids and engine.stats().free_kv_blocks == 64
