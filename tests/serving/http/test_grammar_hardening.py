"""Issue #46 against the real server (in this process: a crash in it would end the test run):
a $ref chain that segfaults llguidance is a 400 (by the static bound, and by the compile worker
when the bounds are lifted) while other requests go on; wide objects are 400s naming the limit,
at compile time or when generation meets the row; a killed compile worker is replaced; a
repeated schema is a cache hit; tool parameter schemas get the same checks; a grammar (Lark or
GBNF) that crashes llguidance is a 400 too."""

import json
import os
import signal
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from graft.serving.engine import grammar_worker
from graft.serving.engine.grammar_check import SchemaLimits
from tests.serving.schema_shapes import LATE_WIDE, ref_chain, wide_object

ASK = [{"role": "user", "content": "Fill in the form."}]
CLOSED = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}  # a short answer even from a random model


def _post(server, timeout=120, **fields):
    body = {"model": "plain", "messages": ASK, "temperature": 0, "max_tokens": 8, **fields}
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=timeout)


def _schema(schema):
    return {"type": "json_schema", "json_schema": {"name": "form", "schema": schema}}


def _refusal(resp, param="response_format") -> str:
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["code"] == "schema_too_complex" and err["param"] == param, err
    assert "\n" not in err["message"] and len(err["message"]) < 500
    return err["message"]


def _serves(server):
    resp = _post(server, max_tokens=4)
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 4


def test_a_deep_ref_chain_is_a_400_and_the_server_keeps_serving(plain_server):
    message = _refusal(_post(plain_server, response_format=_schema(ref_chain(3000))))
    assert message.startswith("response_format nests 3003 levels") and "limit of 128" in message
    _serves(plain_server)


@pytest.fixture
def unbounded():
    """The server's compiler without static bounds: the chain reaches a worker process."""
    big = 1 << 30
    yield grammar_worker.configure(grammar_worker.CompileLimits(
        schema=SchemaLimits(max_bytes=big, max_nodes=big, max_depth=big)))
    grammar_worker.configure(grammar_worker.CompileLimits())


def test_a_schema_that_crashes_the_compiler_ends_no_other_request(plain_server, unbounded):
    with ThreadPoolExecutor(2) as pool:
        plain = pool.submit(_post, plain_server, max_tokens=40)  # in flight meanwhile
        crash = pool.submit(_post, plain_server, response_format=_schema(ref_chain(3000)))
        message = _refusal(crash.result())
        assert plain.result().status_code == 200
    assert "SIGSEGV" in message and unbounded.restarts == 2
    resp = _post(plain_server, max_tokens=60, response_format=_schema(CLOSED))
    assert resp.status_code == 200
    assert json.loads(resp.json()["choices"][0]["message"]["content"]) in ({"ok": True},
                                                                           {"ok": False})


def test_a_grammar_that_crashes_the_compiler_is_a_400(plain_server):
    """A Lark rule chain 5000 deep (it segfaults llguidance) sent as llama.cpp's `grammar`:
    the compile worker dies on it, not the server."""
    chain = "\n".join(["start: r0"] + [f'r{i}: r{i + 1} | "x"' for i in range(5000)]
                      + ['r5000: "y"'])
    restarts = grammar_worker.compiler().restarts
    message = _refusal(_post(plain_server, grammar=chain), param="grammar")
    assert "SIGSEGV" in message and grammar_worker.compiler().restarts == restarts + 2
    _serves(plain_server)


@pytest.mark.parametrize("n,words", [(500, "max_items_in_row of 2000"), (5000, "limit of 4096")])
def test_wide_objects_are_400s_naming_the_limit(plain_server, n, words):
    assert words in _refusal(_post(plain_server, response_format=_schema(wide_object(n))))
    _serves(plain_server)


def test_a_row_limit_met_mid_generation_is_that_requests_400(plain_server):
    late = dict(response_format=_schema(LATE_WIDE), max_tokens=200)
    with ThreadPoolExecutor(2) as pool:
        plain = pool.submit(_post, plain_server, max_tokens=40)
        assert "max_items_in_row of 2000" in _refusal(_post(plain_server, **late))
        assert plain.result().status_code == 200
    with httpx.stream("POST", plain_server.url + "/v1/chat/completions", timeout=120, json={
            "model": "plain", "messages": ASK, "temperature": 0, "stream": True, **late}) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert r.status_code == 200 and events[-1] == "[DONE]"
    last = json.loads(events[-2])  # the text streamed so far, then the error ends the stream
    assert last["error"]["code"] == "schema_too_complex" and "choices" not in last


def test_a_killed_compile_worker_is_replaced(plain_server):
    compiler = grammar_worker.compiler()
    assert _post(plain_server, response_format=_schema(wide_object(6))).status_code == 200
    pids = compiler.worker_pids()
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    before = compiler.restarts
    resp = _post(plain_server, response_format=_schema(wide_object(7)))
    assert resp.status_code == 200 and compiler.restarts > before
    assert not set(pids) & set(compiler.worker_pids())


def test_a_repeated_schema_is_a_cache_hit(plain_server):
    compiler = grammar_worker.compiler()
    assert _post(plain_server, response_format=_schema(wide_object(8))).status_code == 200
    hits, misses = compiler.hits, compiler.misses
    assert _post(plain_server, response_format=_schema(wide_object(8))).status_code == 200
    assert compiler.misses == misses and compiler.hits > hits


@pytest.mark.parametrize("parameters,words", [
    (ref_chain(3000), "over the limit of"),  # required: its bytes; named: its depth
    (ref_chain(1000), "over the limit of 128"),
    (wide_object(500), "max_items_in_row of 2000")])
def test_tool_parameter_schemas_get_the_same_checks(plain_server, parameters, words):
    tool = {"type": "function", "function": {"name": "fill", "parameters": parameters}}
    for choice in ("required", {"type": "function", "function": {"name": "fill"}}):
        message = _refusal(_post(plain_server, tools=[tool], tool_choice=choice), "tools")
        assert message.startswith("tools: a function's `parameters`") and words in message
    _serves(plain_server)


def test_tool_parameters_with_defs_work_under_required(plain_server):
    """Under tool_choice "required" the parameters sit inside the calls array's schema: their
    "#/$defs/..." refs are rebased to where the parameters now are."""
    tool = {"type": "function", "function": {"name": "fill", "parameters": {
        "$defs": {"city": {"enum": ["Paris", "Oslo"]}}, "type": "object",
        "additionalProperties": False, "required": ["city"],
        "properties": {"city": {"$ref": "#/$defs/city"}}}}}
    resp = _post(plain_server, tools=[tool], tool_choice="required", max_tokens=80)
    assert resp.status_code == 200, resp.text
    call = resp.json()["choices"][0]["message"]["tool_calls"][0]["function"]
    assert call["name"] == "fill" and json.loads(call["arguments"])["city"] in ("Paris", "Oslo")
