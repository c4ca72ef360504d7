"""A bounded, seeded fuzz of the chat route driven by its own /openapi.json schema (in the
spirit of schemathesis, without the dependency): values drawn from each field's schema,
valid and not, plus type-confused junk. Every answer is a 200 or a 4xx with an OpenAI-style
error body; never a 5xx, and the server stays healthy. Loopback only."""

import random

import httpx
import pytest

N_CASES = 160
JUNK = [None, True, False, 0, -1, 1.5, 2 ** 64, -(2 ** 63) - 1, 1e308, "", "10", "\ud800",
        "<|im_start|>system", "<image>", [], [1, "a"], {}, {"type": "text"}, [[[[]]]],
        {"a": {"b": {"c": None}}}, "x" * 5000]


def _ref(schema, root):
    while "$ref" in schema:
        schema = root["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _value(schema, root, rng, depth=0):
    """A value of `schema`'s own type (often at its bounds), or sometimes junk."""
    schema = _ref(schema, root)
    if rng.random() < 0.08 or depth > 5:
        return rng.choice(JUNK)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return _value(rng.choice(schema[key]), root, rng, depth + 1)
    if "enum" in schema:
        return rng.choice(schema["enum"])
    kind = schema.get("type")
    if kind == "integer":
        lo, hi = schema.get("minimum", -5), schema.get("maximum", 50)
        return rng.choice([lo, hi, lo - 1, hi + 1, rng.randint(int(lo), int(min(hi, lo + 100)))])
    if kind == "number":
        lo, hi = schema.get("minimum", schema.get("exclusiveMinimum", 0.0)), schema.get(
            "maximum", 10.0)
        return rng.choice([lo, hi, hi + 0.5, lo - 0.5, 1e-300, rng.uniform(lo, hi)])
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "string":
        return rng.choice(["tiny", "hello", "", "a\u00e9\u4e2d", "<|im_end|>", "tiny "])
    if kind == "null":
        return None
    if kind == "array":
        return [_value(schema["items"], root, rng, depth + 1)
                for _ in range(rng.choice([0, 1, 1, 2, 5]))]
    if kind == "object" or "properties" in schema:
        props = schema.get("properties", {})
        keep = set(schema.get("required", [])) | {k for k in props if rng.random() < 0.3}
        return {k: _value(props[k], root, rng, depth + 1) for k in keep}
    return rng.choice(JUNK)


@pytest.fixture(scope="module")
def schema(live_server):
    return httpx.get(live_server.url + "/openapi.json", timeout=30).json()


def test_fuzz_the_chat_route(live_server, schema):
    rng = random.Random(1234)
    request = schema["components"]["schemas"]["ChatCompletionRequest"]
    base = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    seen = {}
    with httpx.Client(base_url=live_server.url, timeout=60) as client:
        for case in range(N_CASES):
            body = dict(base)
            for field in rng.sample(sorted(request["properties"]), rng.choice([1, 1, 2, 3])):
                body[field] = _value(request["properties"][field], schema, rng)
            if isinstance(body.get("max_tokens"), int) and body["max_tokens"] > 8:
                body["max_tokens"] = 8  # keep generation short; validity is unchanged
            body.pop("max_completion_tokens", None) if rng.random() < 0.7 else None
            try:
                resp = client.post("/v1/chat/completions", json=body)
            except UnicodeEncodeError:  # httpx itself cannot send a lone surrogate as JSON
                continue
            seen[resp.status_code] = seen.get(resp.status_code, 0) + 1
            assert resp.status_code < 500, (case, body, resp.text)
            if resp.status_code != 200:
                err = resp.json()["error"]
                assert set(err) == {"message", "type", "param", "code"}, resp.text
        assert client.get("/health").json() == {"status": "ok"}
    assert seen.get(200) and seen.get(400)  # both sides of validation were exercised
