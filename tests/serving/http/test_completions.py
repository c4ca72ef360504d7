"""POST /v1/completions through the official openai client against the real server: the same
greedy tokens as the engine on the same ids, streaming equal to the whole answer, the
completions logprobs format, echo, and one-line 400s naming the field."""

import json

import httpx
import openai
import pytest

from graft.serving import Engine, EngineConfig, SamplingParams

PROMPT = "The quick brown fox"
N = 12


@pytest.fixture(scope="module")
def client(plain_server):
    return openai.OpenAI(base_url=plain_server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def reference(tiny_llama_2k):
    """Prompt ids and the engine's own greedy continuation of them (a separate engine)."""
    engine = Engine.from_pretrained(tiny_llama_2k, EngineConfig(num_kv_blocks=32))
    ids = engine.tokenizer(PROMPT, add_special_tokens=True)["input_ids"]
    (out,) = engine.generate(prompt_token_ids=[ids], sampling_params=SamplingParams(
        temperature=0, max_tokens=N, ignore_eos=True))
    return ids, out


def create(client, extra=None, **fields):
    fields.setdefault("model", "plain")
    fields.setdefault("prompt", PROMPT)
    fields.setdefault("max_tokens", N)
    extra = {"ignore_eos": True, **(extra or {})}
    return client.completions.create(temperature=0, extra_body=extra, **fields)


def test_greedy_text_equals_the_engine_on_the_same_ids(client, reference):
    ids, out = reference
    for prompt in (PROMPT, ids, [ids], [PROMPT]):
        reply = create(client, prompt=prompt)
        choice = reply.choices[0]
        assert choice.text == out.text and choice.finish_reason == "length"
        assert reply.object == "text_completion" and reply.id.startswith("cmpl-")
        assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (len(ids), N)


def test_streaming_equals_the_whole_answer(client):
    whole = create(client, logprobs=2)
    chunks = list(create(client, logprobs=2, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage.completion_tokens == N and chunks[-1].choices == []
    parts = [c.choices[0] for c in chunks[:-1]]
    assert "".join(p.text for p in parts) == whole.choices[0].text
    assert [p.finish_reason for p in parts if p.finish_reason] == ["length"]
    streamed = [lp for p in parts if p.logprobs for lp in zip(
        p.logprobs.tokens, p.logprobs.token_logprobs, p.logprobs.text_offset)]
    lp = whole.choices[0].logprobs
    assert streamed == list(zip(lp.tokens, lp.token_logprobs, lp.text_offset))


def test_logprobs_have_the_completions_shape(client):
    choice = create(client, logprobs=3).choices[0]
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) \
        == len(lp.text_offset) == N
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert lp.text_offset[-1] <= len(choice.text)
    for token_lp, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert 1 <= len(top) <= 3 and token_lp <= 0
        assert token_lp == pytest.approx(max(top.values()))  # greedy: the sampled one is best
    assert all(top == {} for top in create(client, logprobs=0).choices[0].logprobs.top_logprobs)


def test_echo_and_stop(client, reference):
    ids, out = reference
    echoed = create(client, echo=True).choices[0].text
    assert echoed == PROMPT + out.text
    streamed = "".join(c.choices[0].text for c in create(client, echo=True, stream=True))
    assert streamed == echoed
    stop = out.text[len(out.text) // 2:][:2]
    cut = create(client, stop=[stop]).choices[0]
    assert cut.finish_reason == "stop" and cut.text == out.text[:out.text.index(stop)]


@pytest.mark.parametrize("fields,param", [
    ({"prompt": ["one", ""]}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": [5, 10 ** 6]}, "prompt[1]"),
    ({"prompt": [[5], [6, 10 ** 6]]}, "prompt[1][1]"),
    ({"prompt": ["one", "word " * 3000]}, "prompt[1]"),
    ({"prompt": ["one"] * 65, "n": 2}, "n"),
    ({"n": 129}, "n"),
    ({"prompt": "word " * 3000}, "prompt"),
    ({"suffix": "tail"}, "suffix"),
    ({"logprobs": 21}, "logprobs"),
    ({"model": "nope"}, "model"),
])
def test_bad_requests_are_one_line_400s_naming_the_field(client, fields, param):
    with pytest.raises(openai.APIStatusError) as err:
        create(client, **fields)
    body = err.value.body
    assert err.value.status_code in (400, 404) and body["param"] == param
    assert "\n" not in body["message"]


def test_openapi_lists_completions(plain_server):
    schema = httpx.get(plain_server.url + "/openapi.json", timeout=30).json()
    op = schema["paths"]["/v1/completions"]["post"]
    ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"].split("/")[-1]
    assert "prompt" in schema["components"]["schemas"][ref]["properties"]
    assert "text/event-stream" in op["responses"]["200"]["content"]



def test_the_sampling_knobs_reach_completions(client, reference, plain_server):
    """Chat and completions share their sampling fields (openai_chat.SamplingFields)."""
    ids, out = reference
    forced = out.token_ids[0] + 1  # not what greedy picks first
    reply = create(client, max_tokens=1, logprobs=0,
                   extra={"logit_bias": {str(forced): 100}})
    assert reply.choices[0].logprobs.tokens == [plain_server.app.state.ctx.tokenizer.decode(
        [forced])]
    schema = {"type": "object", "properties": {"a": {"enum": ["x", "y"]}}, "required": ["a"],
              "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    answer = create(client, max_tokens=60, extra={"response_format": fmt}).choices[0]
    assert answer.finish_reason == "stop" and json.loads(answer.text)["a"] in ("x", "y")
