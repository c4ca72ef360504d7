"""response_format, vLLM's structured_outputs, logit_bias, min_tokens and the penalties through
the official openai client against the real server (tiny random model): json_schema answers
parse and validate, streamed or not, batched beside free requests; regex and choice answers
match whole; bad schemas and patterns are a 400 naming the field."""

import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import httpx
import pytest
from pydantic import BaseModel, Field

from tests.serving.schema_check import ANSWER, TOOL_CALL, problems

ASK = [{"role": "user", "content": "Which digit is shown? Answer in JSON."}]


@pytest.fixture(scope="module")
def client(live_server):
    from openai import OpenAI

    return OpenAI(base_url=live_server.url + "/v1", api_key="unused")


@pytest.fixture(scope="module")
def tok(live_server):
    return live_server.app.state.ctx.tokenizer


def _schema_format(schema, name="answer"):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def _valid(choice, schema):
    assert choice.finish_reason == "stop", choice
    value = json.loads(choice.message.content)
    assert problems(value, schema) == [], choice.message.content
    return value


@pytest.mark.parametrize("schema", [ANSWER, TOOL_CALL], ids=["answer", "tool_call"])
def test_json_schema_answers_validate(client, schema):
    for temperature, seed in ((0.0, None), (1.0, 1), (1.0, 2)):
        out = client.chat.completions.create(
            model="tiny", messages=ASK, temperature=temperature, seed=seed, max_tokens=150,
            response_format=_schema_format(schema))
        _valid(out.choices[0], schema)


class Answer(BaseModel):
    answer: Literal["yes", "no"]
    count: int = Field(ge=0, le=9)


def test_openai_parse_with_a_pydantic_model(client):
    out = client.chat.completions.parse(model="tiny", messages=ASK, temperature=0,
                                        max_tokens=60, response_format=Answer)
    assert isinstance(out.choices[0].message.parsed, Answer)


def test_json_object_parses(client, tok):
    # a random model rarely closes a free-form object: nudge '"' and '}' up a little
    bias = {str(tok.convert_tokens_to_ids('"')): 5, str(tok.convert_tokens_to_ids("}")): 3}
    for seed in (1, 2, 3):
        out = client.chat.completions.create(
            model="tiny", messages=ASK, temperature=1.0, seed=seed, max_tokens=100,
            logit_bias=bias, response_format={"type": "json_object"})
        assert isinstance(_valid(out.choices[0], {"type": "object"}), dict)


def test_streamed_json_schema_equals_the_answer(client):
    kw = dict(model="tiny", messages=ASK, temperature=0, max_tokens=150,
              response_format=_schema_format(TOOL_CALL, "call"))
    whole = client.chat.completions.create(**kw).choices[0]
    chunks = list(client.chat.completions.create(stream=True, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.message.content and _valid(whole, TOOL_CALL)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


def test_guided_and_free_requests_batched(client):
    def ask(i):
        kw = dict(model="tiny", messages=[{"role": "user", "content": f"Question {i}?"}],
                  temperature=1.0, seed=i, max_tokens=150)
        if i % 2:
            kw["response_format"] = _schema_format(ANSWER if i % 4 == 1 else TOOL_CALL)
        return i, client.chat.completions.create(**kw).choices[0]

    with ThreadPoolExecutor(6) as pool:
        for i, choice in pool.map(ask, range(8)):
            if i % 2:
                _valid(choice, ANSWER if i % 4 == 1 else TOOL_CALL)
            else:
                assert choice.finish_reason in ("stop", "length")


def test_max_tokens_cut_is_length(client):
    kw = dict(model="tiny", messages=ASK, temperature=0, response_format=_schema_format(ANSWER))
    whole = client.chat.completions.create(max_tokens=150, **kw).choices[0]
    cut = client.chat.completions.create(max_tokens=3, **kw).choices[0]
    assert cut.finish_reason == "length" and _valid(whole, ANSWER)
    assert whole.message.content.startswith(cut.message.content)
    with pytest.raises(json.JSONDecodeError):
        json.loads(cut.message.content)


def test_logit_bias_forces_a_token(client, tok):
    tid = tok.convert_tokens_to_ids("red")
    out = client.chat.completions.create(model="tiny", messages=ASK, temperature=1.0, seed=3,
                                         max_tokens=5, logit_bias={str(tid): 100})
    assert out.choices[0].message.content == "red" * 5
    assert out.usage.completion_tokens == 5


def test_min_tokens_keeps_going_past_eos(client, tok):
    bias = {str(tok.eos_token_id): 100}  # eos is what the model says at once
    kw = dict(model="tiny", messages=ASK, temperature=0, max_tokens=20, logit_bias=bias)
    eager = client.chat.completions.create(**kw)
    assert eager.usage.completion_tokens == 1 and eager.choices[0].message.content == ""
    held = client.chat.completions.create(**kw, extra_body={"min_tokens": 6})
    assert held.usage.completion_tokens == 7 and held.choices[0].finish_reason == "stop"


def test_penalties_change_a_repetitive_answer(client):
    kw = dict(model="tiny", messages=ASK, temperature=0, max_tokens=16)
    plain = client.chat.completions.create(**kw).choices[0].message.content
    for extra in (dict(frequency_penalty=1.5), dict(presence_penalty=2.0),
                  dict(extra_body={"repetition_penalty": 1.5})):
        assert client.chat.completions.create(**kw, **extra).choices[0].message.content != plain


CHOICES = ["red", "green", "blue (dark)"]
YES_NO = 'root ::= "(" answer ")"\nanswer ::= "yes" | "no"'  # GBNF, as llama.cpp takes it


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("outputs, check", [
    ({"regex": "[0-9]{2}-[a-z]{3}"}, lambda text: re.fullmatch("[0-9]{2}-[a-z]{3}", text)),
    ({"choice": CHOICES}, lambda text: text in CHOICES),
    ({"json": json.dumps(ANSWER)}, lambda text: problems(json.loads(text), ANSWER) == []),
    ({"grammar": YES_NO}, lambda text: text in ("(yes)", "(no)")),
])
def test_vllm_structured_outputs_hold_whole(live_server, path, outputs, check):
    ask = {"messages": ASK} if "chat" in path else {"prompt": "Pick one:"}
    for temperature, seed in ((0.0, None), (1.0, 5)):
        resp = httpx.post(live_server.url + path, timeout=60, json={
            "model": "tiny", "max_tokens": 150, "temperature": temperature, "seed": seed,
            "structured_outputs": outputs, **ask})
        assert resp.status_code == 200, resp.text
        choice = resp.json()["choices"][0]
        text = choice["message"]["content"] if "chat" in path else choice["text"]
        assert choice["finish_reason"] == "stop" and check(text), text


@pytest.mark.parametrize("body,param,words", [
    ({"response_format": _schema_format({"type": "foo"})}, "response_format", "Invalid type"),
    ({"response_format": _schema_format({"type": "string", "pattern": "(("})}, "response_format",
     "regex parse error"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema", "Field required"),
    ({"response_format": {"type": "xml"}}, "response_format", "'json_schema'"),
    ({"logit_bias": {"99999": 1}}, "logit_bias", "outside the model's vocabulary"),
    ({"logit_bias": {"7": 150}}, "logit_bias", "[-100, 100]"),
    ({"presence_penalty": 2.5}, "presence_penalty", "less than or equal to 2"),
    ({"min_tokens": 9, "max_tokens": 4}, "min_tokens", "max_tokens=4"),
    ({"structured_outputs": {"regex": "(("}}, "structured_outputs.regex", "not a usable regex"),
    ({"structured_outputs": {"json": {"type": "foo"}}}, "structured_outputs.json",
     "Invalid type"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs",
     "exactly one of"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice", "at least 1 item"),
    ({"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}},
     "structured_outputs", "not both"),
    ({"structured_outputs": {"grammar": "start: foo"}}, "structured_outputs.grammar",
     "not a usable grammar: at 1(8): unknown name"),
    ({"grammar": 'x ::= "a"'}, "grammar", "No 'root' rule found"),
    ({"grammar": YES_NO, "response_format": {"type": "json_object"}}, "grammar", "not both"),
    ({"grammar": YES_NO, "structured_outputs": {"regex": "a"}}, "grammar", "not both"),
])
def test_bad_settings_are_one_line_400s(live_server, body, param, words):
    resp = httpx.post(live_server.url + "/v1/chat/completions", timeout=60,
                      json={"model": "tiny", "messages": ASK, "max_tokens": 8, **body})
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == param and words in err["message"] and "\n" not in err["message"]


def test_llama_cpp_grammar_field_holds(live_server):
    for path, ask in (("/v1/chat/completions", {"messages": ASK}), ("/v1/completions",
                                                                    {"prompt": "Pick:"})):
        resp = httpx.post(live_server.url + path, timeout=60, json={
            "model": "tiny", "max_tokens": 20, "temperature": 1.0, "seed": 2, "grammar": YES_NO,
            **ask})
        choice = resp.json()["choices"][0]
        text = choice["message"]["content"] if "chat" in path else choice["text"]
        assert choice["finish_reason"] == "stop" and text in ("(yes)", "(no)"), text


@pytest.mark.parametrize("field,value", [("structured_outputs", {"regex": "a"}),
                                         ("grammar", YES_NO)])
def test_tool_choice_and_structured_outputs_are_one_grammar_too_many(plain_server, field, value):
    # the 2k-context server: a tool prompt alone is longer than live_server's context
    resp = httpx.post(plain_server.url + "/v1/chat/completions", timeout=60, json={
        "model": "plain", "messages": ASK, "max_tokens": 8, field: value,
        "tool_choice": "required", "tools": [{"type": "function", "function": {"name": "f"}}]})
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == field and "send one of them" in err["message"], err