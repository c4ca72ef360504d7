"""Guided decoding (SamplingParams.guided_json, guided_regex, guided_choice through
llguidance): outputs parse and validate (or match whole), batched with free sequences, greedy
and sampled, identical with speculation on, across preemption; max_tokens cuts with
"length"; a bad schema, regex or choice list is one line naming the field."""

import json

import pytest
import torch

from graft.errors import GraftConfigError
from graft.serving import Engine, EngineConfig, SamplingParams
from tests.serving.conftest import make_prompts
from tests.serving.schema_check import ANSWER, TOOL_CALL, problems


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return Engine.from_pretrained(tiny_llama, EngineConfig(num_kv_blocks=64))


def _params(schema, **kw):
    return SamplingParams(**{"temperature": 0.0, "max_tokens": 120, "guided_json": schema, **kw})


def _valid(out, schema):
    assert out.finish_reason == "stop", (out.finish_reason, out.text)
    value = json.loads(out.text)
    assert problems(value, schema) == [], out.text
    return value


MIXED = [_params(ANSWER), _params(ANSWER, temperature=1.0, seed=4),
         _params(TOOL_CALL), _params(TOOL_CALL, temperature=1.0, seed=11),
         _params(ANSWER, min_tokens=100)]  # the grammar ends before min_tokens: it wins


def test_guided_rows_validate_beside_free_rows(engine):
    prompts = make_prompts((10, 25, 7, 18, 12, 30), seed=31)
    free = SamplingParams(temperature=0.0, max_tokens=20)
    alone = engine.generate(prompt_token_ids=[prompts[-1]], sampling_params=free)[0]
    outs = engine.generate(prompt_token_ids=prompts, sampling_params=MIXED + [free])
    for out, params in zip(outs, MIXED):
        _valid(out, params.guided_json)
        assert engine.tokenizer.decode(out.token_ids) == out.text  # no eos: the grammar ended it
    assert outs[-1].token_ids == alone.token_ids  # a free row is untouched by its neighbours
    assert len(outs[4].token_ids) < 100
    names = {json.loads(o.text)["name"] for o in outs[2:4]}
    assert names <= {"get_weather", "add"}


def test_any_json_object(engine):
    """guided_json=True (OpenAI's json_object); a random model needs a nudge to close one."""
    tok = engine.tokenizer
    bias = {tok.convert_tokens_to_ids('"'): 5.0, tok.convert_tokens_to_ids("}"): 3.0}
    prompt = tok("What is shown in the image?")["input_ids"]
    for seed in (1, 2, 3):
        out = engine.generate(prompt_token_ids=[prompt], sampling_params=_params(
            True, temperature=1.0, seed=seed, logit_bias=bias))[0]
        assert isinstance(_valid(out, {"type": "object"}), dict)


def test_guided_output_is_the_same_with_speculation(tiny_llama, engine):
    prompts = make_prompts((10, 25, 7, 18, 12), seed=32)
    prompts.append(prompts[0] + prompts[0])  # a free row that prompt lookup speculates on
    params = MIXED + [SamplingParams(temperature=0.0, max_tokens=24)]
    want = [o.token_ids for o in engine.generate(prompt_token_ids=prompts, sampling_params=params)]
    spec = Engine.from_pretrained(tiny_llama, EngineConfig(num_kv_blocks=64, speculative="ngram"))
    outs = spec.generate(prompt_token_ids=prompts, sampling_params=params)
    assert [o.token_ids for o in outs] == want
    assert all(o.spec_verify_steps == 0 for o in outs[:5])  # guided rows never speculate
    assert outs[5].spec_verify_steps > 0


def test_guided_output_survives_preemption(tiny_llama, engine):
    prompts = make_prompts((20, 18, 22, 9), seed=33)
    params = [_params(ANSWER), _params(TOOL_CALL, temperature=1.0, seed=5), _params(TOOL_CALL),
              _params(ANSWER, temperature=1.0, seed=6)]
    want = [o.token_ids for o in engine.generate(prompt_token_ids=prompts, sampling_params=params)]
    tight = Engine.from_pretrained(tiny_llama, EngineConfig(
        block_size=4, num_kv_blocks=30, max_num_batched_tokens=8, max_num_seqs=4))
    outs = tight.generate(prompt_token_ids=prompts, sampling_params=params)
    assert tight.scheduler.num_preemptions > 0
    assert [o.token_ids for o in outs] == want
    for out, p in zip(outs, params):
        _valid(out, p.guided_json)


def test_max_tokens_cuts_guided_json_with_length(engine):
    prompt = make_prompts((10,), seed=34)[0]
    full = engine.generate(prompt_token_ids=[prompt], sampling_params=_params(ANSWER))[0]
    cut = engine.generate(prompt_token_ids=[prompt], sampling_params=_params(
        ANSWER, max_tokens=len(full.token_ids) - 1))[0]
    assert cut.finish_reason == "length" and cut.token_ids == full.token_ids[:-1]
    with pytest.raises(json.JSONDecodeError):
        json.loads(cut.text)


def test_streamed_guided_text_adds_up(engine):
    engine.add_request("g", make_prompts((12,), seed=35)[0], _params(TOOL_CALL))
    streamed, final = "", None
    while engine.has_unfinished_requests():
        for out in engine.step():
            streamed += out.new_text
            final = out
    assert streamed == final.text and _valid(final, TOOL_CALL)


@pytest.mark.parametrize("schema,reason", [
    ({"type": "foo"}, "Invalid type: foo"),
    ({"type": "string", "pattern": "(("}, "regex parse error"),
    ({"properties": {"x": {"$ref": "#/$defs/nope"}}}, "does not exist"),
    ("{}", "must be None, True"),
])
def test_bad_schema_is_one_line_naming_the_field(schema, reason):
    with pytest.raises(GraftConfigError, match="SamplingParams.guided_json") as err:
        SamplingParams(guided_json=schema)
    assert reason in str(err.value) and "\n" not in str(err.value)


CHOICES = ["positive", "negative", "neutral (n/a)"]


@pytest.mark.parametrize("seed", [None, 3, 8])
def test_regex_and_choice_outputs_match_whole(engine, seed):
    import re

    prompts = make_prompts((12, 20), seed=5)
    kw = {"temperature": 0.0} if seed is None else {"temperature": 1.0, "seed": seed}
    pattern = r"[0-9]{3}-[a-z]{2,4}"
    regex, choice = engine.generate(prompt_token_ids=prompts, sampling_params=[
        SamplingParams(max_tokens=40, guided_regex=pattern, **kw),
        SamplingParams(max_tokens=40, guided_choice=CHOICES, **kw)])
    assert regex.finish_reason == "stop" and re.fullmatch(pattern, regex.text), regex.text
    assert choice.finish_reason == "stop" and choice.text in CHOICES, choice.text


ARITHMETIC_GBNF = r'''root ::= expr "="
expr ::= term (("+" | "-") term)*
term ::= [0-9]+ | "(" expr ")"'''
ARITHMETIC_LARK = r'''start: expr "="
expr: term (("+" | "-") term)*
term: /[0-9]+/ | "(" expr ")"'''


@pytest.mark.parametrize("grammar", [ARITHMETIC_GBNF, ARITHMETIC_LARK])
@pytest.mark.parametrize("seed", [None, 4])
def test_a_context_free_grammar_holds(engine, grammar, seed):
    """Lark or llama.cpp's GBNF: parentheses never close more than they opened, which no
    regex can hold (a random model may not finish within max_tokens: then the text is a
    prefix of the language); a finite grammar ends."""
    kw = {"temperature": 0.0} if seed is None else {"temperature": 1.0, "seed": seed}
    prompts = make_prompts((10, 14), seed=6)
    out, yes_no = engine.generate(prompt_token_ids=prompts, sampling_params=[
        SamplingParams(max_tokens=60, guided_cfg=grammar, **kw),
        SamplingParams(max_tokens=60, guided_cfg='root ::= "(" ("yes" | "no") ")"', **kw)])
    depth = 0
    for ch in out.text.removesuffix("=") if out.finish_reason == "stop" else out.text:
        assert ch in "0123456789+-()", out.text
        depth += {"(": 1, ")": -1}.get(ch, 0)
        assert depth >= 0, out.text
    assert out.finish_reason == "length" or (out.text.endswith("=") and depth == 0), out.text
    assert yes_no.finish_reason == "stop" and yes_no.text in ("(yes)", "(no)"), yes_no.text


@pytest.mark.parametrize("kw, words", [
    ({"guided_cfg": 'start: foo'}, "guided_cfg is not a usable grammar: at 1(8): unknown name"),
    ({"guided_cfg": 'root ::= "a" ('}, "guided_cfg is not a usable grammar: Failed to convert"),
    ({"guided_cfg": 'x ::= "a"'}, "No 'root' rule found"),
    ({"guided_cfg": "start: x\nx: x"}, "guided_cfg is not a usable grammar: no text matches it"),
    ({"guided_cfg": " "}, "guided_cfg must be a non-empty grammar text"),
    ({"guided_cfg": "start: " + " | ".join(f'"{i}"' for i in range(20000))},
     "guided_cfg is 188894 bytes as a grammar, over the limit of 131072"),
    ({"guided_cfg": 'start: "a"', "guided_regex": "a"}, "guided_cfg cannot go with guided_regex"),
    ({"guided_regex": "(("}, "guided_regex is not a usable regex"),
    ({"guided_regex": r"[^\s\S]"}, "guided_regex is not a usable regex: no text matches it"),
    ({"guided_regex": ""}, "guided_regex must be a non-empty string"),
    ({"guided_choice": []}, "guided_choice must be a non-empty list"),
    ({"guided_choice": ["x" * 70000, "y" * 70000]}, "guided_choice is 140005 bytes"),
    ({"guided_choice": ["a"], "guided_regex": "a"}, "guided_choice cannot go with guided_regex"),
])
def test_bad_regex_or_choice_is_one_line_naming_the_field(kw, words):
    with pytest.raises(GraftConfigError) as err:
        SamplingParams(**kw)
    assert words in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_false_is_free_text(engine):
    assert SamplingParams(guided_json=False).guided_json is None
    prompts = make_prompts((8,), seed=36)
    outs = [engine.generate(prompt_token_ids=prompts, sampling_params=SamplingParams(
        temperature=0.0, max_tokens=6, guided_json=g))[0] for g in (False, None)]
    assert outs[0].token_ids == outs[1].token_ids and outs[0].text == outs[1].text


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_guided_on_cuda_graphs(tiny_llama, engine):
    """On a GPU the mask unpacks on the device and decode logits come from a CUDA graph's
    static buffer (processed on a copy): the same tokens as on CPU (tiny fp32 model)."""
    prompts = make_prompts((10, 25, 7, 18, 12), seed=37)
    want = engine.generate(prompt_token_ids=prompts, sampling_params=MIXED)
    gpu = Engine.from_pretrained(tiny_llama, EngineConfig(device="cuda", num_kv_blocks=64))
    outs = gpu.generate(prompt_token_ids=prompts, sampling_params=MIXED)
    for out, params in zip(outs, MIXED):
        _valid(out, params.guided_json)
    assert [o.token_ids for o in outs[::2]] == [o.token_ids for o in want[::2]]  # greedy rows
    assert gpu.runner.decode_graphs.replays > 0
