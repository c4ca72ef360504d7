"""API keys (--api-key, $GRAFT_API_KEY) on /v1 and optionally /metrics, --max-queued-requests
as a 429 with Retry-After, 405 with Allow, 404 naming the path, and the chat models in
/openapi.json."""

import threading

import httpx
import pytest

import graft
from graft.serving.http.plumbing.auth import APIKeys
from tests.serving.http.conftest import LiveServer

URL = "/v1/chat/completions"
BODY = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def server(tiny_run_dir):
    import argparse
    import os

    from graft.serving.http import serve_cli

    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    args = parser.parse_args([str(tiny_run_dir), "--served-model-name", "tiny",
                              "--api-key", "key-one", "--api-key", "key-two", "--auth-metrics",
                              "--max-queued-requests", "1", "--max-model-len", "128",
                              "--num-kv-blocks", "32"])
    os.environ["GRAFT_API_KEY"] = "key-env"
    try:
        app = serve_cli.build(args)
    finally:
        del os.environ["GRAFT_API_KEY"]
    with LiveServer(app) as live:
        yield live


def _auth(key):
    return {"Authorization": f"Bearer {key}"}


def test_keys_are_checked_on_v1_and_metrics(server):
    for path in ("/v1/models", "/metrics"):
        missing = httpx.get(server.url + path)
        assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
        err = missing.json()["error"]
        assert err["code"] == "invalid_api_key" and err["type"] == "invalid_request_error"
        assert httpx.get(server.url + path, headers=_auth("key-wrong")).status_code == 401
        for key in ("key-one", "key-two", "key-env"):
            assert httpx.get(server.url + path, headers=_auth(key)).status_code == 200
    assert httpx.get(server.url + "/health").status_code == 200  # not --auth-health
    assert httpx.get(server.url + "/version").json() == {"version": graft.__version__}
    # refused before the body is read: a huge body without a key costs nothing
    assert httpx.post(server.url + URL, content=b"x" * 100_000,
                      headers={"content-type": "application/json"}).status_code == 401
    ok = httpx.post(server.url + URL, json=BODY, headers=_auth("key-two"), timeout=60)
    assert ok.status_code == 200


def test_openai_client_with_a_key(server):
    from openai import AuthenticationError, OpenAI

    good = OpenAI(base_url=server.url + "/v1", api_key="key-one")
    assert good.chat.completions.create(**BODY).usage.completion_tokens <= 2
    with pytest.raises(AuthenticationError):
        OpenAI(base_url=server.url + "/v1", api_key="nope").models.list()


def test_key_comparison():
    keys = APIKeys(["abc"])
    assert keys.accepts("Bearer abc") and keys.accepts("bearer abc")
    for header in (None, "", "abc", "Basic abc", "Bearer ab", "Bearer abcd", "Bearer "):
        assert not keys.accepts(header)
    assert not APIKeys([]) and not APIKeys([""])


def test_full_queue_is_a_429_with_retry_after(server, monkeypatch):
    ctx = server.app.state.ctx
    gate, real = threading.Event(), ctx.engine.step

    def held_step():  # the engine thread waits here, so the first request stays queued
        gate.wait(timeout=30)
        return real()

    monkeypatch.setattr(ctx.engine, "step", held_step)
    first = []
    thread = threading.Thread(target=lambda: first.append(
        httpx.post(server.url + URL, json=BODY, headers=_auth("key-one"), timeout=60)))
    thread.start()
    try:
        for _ in range(400):
            if ctx.worker.queue_depth() == 1:
                break
            threading.Event().wait(0.01)
        assert ctx.worker.queue_depth() == 1
        refused = httpx.post(server.url + URL, json=BODY, headers=_auth("key-one"), timeout=60)
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["code"] == "queue_full"
    finally:
        gate.set()
        thread.join(timeout=60)
    assert first[0].status_code == 200


def test_405_carries_allow(server):
    resp = httpx.get(server.url + URL, headers=_auth("key-one"))
    assert resp.status_code == 405 and resp.headers["allow"] == "POST"
    error = resp.json()["error"]
    assert error["code"] == "method_not_allowed"
    assert error["message"] == f"GET {URL} is not allowed; use POST"


def test_unknown_route_names_the_path_and_where_routes_are_listed(server):
    resp = httpx.post(server.url + "/v1/chat/completion", json=BODY, headers=_auth("key-one"))
    assert resp.status_code == 404
    error = resp.json()["error"]
    assert error["code"] == "route_not_found" and error["type"] == "not_found_error"
    assert "POST /v1/chat/completion;" in error["message"] and "/openapi.json" in error["message"]


def test_openapi_describes_the_chat_route(server):
    from graft.serving.http.openai.openapi_schema import ChatCompletion

    for path in ("/openapi.json", "/docs", "/redoc"):  # the API's map is behind the key too
        assert httpx.get(server.url + path).status_code == 401
        assert httpx.get(server.url + path, headers=_auth("key-one")).status_code == 200
    schema = httpx.get(server.url + "/openapi.json", headers=_auth("key-one")).json()
    op = schema["paths"][URL]["post"]
    ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert ref == "#/components/schemas/ChatCompletionRequest"
    request = schema["components"]["schemas"]["ChatCompletionRequest"]
    assert {"model", "messages", "max_tokens", "seed", "stream"} <= set(request["properties"])
    assert set(request["required"]) == {"model", "messages"}
    assert "ChatCompletion" in schema["components"]["schemas"]
    assert op["responses"]["401"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/ErrorBody")
    # the documented response is the one actually sent
    body = httpx.post(server.url + URL, json=BODY, headers=_auth("key-one"), timeout=60).json()
    ChatCompletion.model_validate(body)


def test_queue_limits_on_requests_and_tokens():
    from graft.serving.http.plumbing.admission import (AdmissionController, QueueItem, QueueLimits,
                                              StepCostModel)
    from graft.serving.http.openai.openai_chat import APIError

    admission = AdmissionController(StepCostModel(), token_budget=64)
    item = lambda n: QueueItem(float("inf"), n, 0)  # noqa: E731
    tokens = QueueLimits(admission, max_tokens=100)
    tokens.check([item(60)], 0, item(40))  # exactly at the limit
    with pytest.raises(APIError) as err:
        tokens.check([item(60)], 0, item(41))
    assert err.value.status == 429 and int(err.value.headers["Retry-After"]) >= 1
    tokens.check([], 0, item(10_000))  # alone, a request is never refused for its size
    requests = QueueLimits(admission, max_requests=2)
    requests.check([item(1)], 3)
    with pytest.raises(APIError, match="--max-queued-requests 2"):
        requests.check([item(1), item(1)], 3)
