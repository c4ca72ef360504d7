"""Half-sent requests are not held: a header deadline (408 and close), a body deadline (408),
a header size cap and a concurrency limit, all from `graft serve` options. Each refusal is
the OpenAI-style JSON error body every other refusal has."""

import json
import socket
import time

import pytest

from tests.serving.http.conftest import LiveServer


def _serve(tiny_llama, *flags):
    import argparse

    from graft.serving.http import serve_cli

    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    args = parser.parse_args([str(tiny_llama), "--served-model-name", "plain",
                              "--max-model-len", "128", "--num-kv-blocks", "32", *flags])
    return LiveServer(serve_cli.build(args), **serve_cli.uvicorn_options(args))


@pytest.fixture(scope="module")
def server(tiny_llama):
    with _serve(tiny_llama, "--header-timeout-s", "0.5", "--request-body-timeout-s", "0.5",
                "--max-header-bytes", "4096", "--limit-concurrency", "8",
                "--request-timeout-s", "0.001") as live:  # no answer of 200 tokens fits
        yield live


def _error(reply: bytes, status: int, code: str) -> dict:
    """The JSON error of a raw HTTP reply, checked for its status line and shape."""
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d" % status), reply
    assert b"content-type: application/json" in head.lower(), head
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == code, err
    return err


def _talk(server, data: bytes, wait_s: float = 5.0) -> tuple[bytes, float]:
    """Send `data`, then read until the server closes (bounded); (reply, seconds taken)."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.port), timeout=wait_s) as sock:
        sock.sendall(data)
        reply = b""
        while time.monotonic() - start < wait_s:
            try:
                chunk = sock.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            reply += chunk
    return reply, time.monotonic() - start


@pytest.mark.parametrize("partial", [b"", b"POST /v1/chat/completions HTTP/1.1\r\n",
                                     b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Slow: 1"])
def test_half_sent_headers_time_out(server, partial):
    reply, took = _talk(server, partial)
    _error(reply, 408, "request_timeout")
    assert took < 3.0


def test_keep_alive_connection_gets_a_fresh_header_deadline(server):
    request = b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n"
    reply, took = _talk(server, request + b"GET /health HTTP/1.1\r\n")  # then stalls
    assert reply.startswith(b"HTTP/1.1 200") and b"408" in reply.split(b"\r\n\r\n", 1)[1]
    assert took < 3.0


def test_slow_body_times_out(server):
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\ncontent-type: application/json"
            b"\r\ncontent-length: 1000\r\n\r\n{\"model\":")
    reply, took = _talk(server, head)
    _error(reply, 408, "request_timeout")
    assert took < 3.0


def test_oversized_headers_are_refused(server):
    # h11 refuses once it buffers more than the limit without a complete header block
    reply, _ = _talk(server, b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * 8000)
    _error(reply, 400, "invalid_http_request")  # not the 408: refused before the deadline


def test_malformed_request_line_is_a_json_400(server):
    reply, _ = _talk(server, b"NOT HTTP AT ALL\r\n\r\n")
    _error(reply, 400, "invalid_http_request")


@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_over_the_request_timeout_is_stopped(server, stream):
    import httpx

    ctx = server.app.state.ctx
    timed_out0 = ctx.metrics.timed_out.value
    body = {"model": "plain", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 100, "ignore_eos": True, "stream": stream}
    resp = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    if stream:  # headers went out with the first event: the stream ends with the error
        assert resp.status_code == 200
        events = [json.loads(line[6:]) for line in resp.text.splitlines()
                  if line.startswith("data: {")]
        err = events[-1]["error"]
        assert not any(e.get("choices", [{}])[0].get("finish_reason") for e in events[:-1])
    else:
        assert resp.status_code == 408
        err = resp.json()["error"]
    assert err["code"] == "request_timeout" and "--request-timeout-s" in err["message"]
    assert ctx.metrics.timed_out.value == timed_out0 + 1
    end = time.monotonic() + 30  # the abort reaches the engine at its next step
    while ctx.worker.num_running() and time.monotonic() < end:
        time.sleep(0.02)
    assert ctx.worker.num_running() == 0 and ctx.kv_blocks()[0] == 0


def test_a_whole_request_still_works(server):
    reply, _ = _talk(server, b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b'{"status":"ok"}')


def test_over_the_connection_limit_is_a_json_503(tiny_llama):
    # a server of its own: idle connections must outlive a (default, 10 s) header deadline
    with _serve(tiny_llama, "--limit-concurrency", "3") as live:
        held = [socket.create_connection(("127.0.0.1", live.port), timeout=5) for _ in range(3)]
        try:
            reply, _ = _talk(live, b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\n\r\n")
            err = _error(reply, 503, "over_capacity")
            assert "--limit-concurrency" in err["message"] and b"retry-after: 1" in reply
        finally:
            for sock in held:
                sock.close()
        deadline = time.monotonic() + 10  # the held connections' close reaches the server
        while True:
            reply, _ = _talk(live, b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close"
                                   b"\r\n\r\n")
            if reply.startswith(b"HTTP/1.1 200") or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert reply.startswith(b"HTTP/1.1 200"), reply
