"""Half-sent requests are not held: a header deadline (408 and close), a body deadline (408),
a header size cap and uvicorn's concurrency limit, all from `graft serve` options."""

import socket
import time

import pytest

from tests.serving.http.conftest import LiveServer


@pytest.fixture(scope="module")
def server(tiny_llama):
    import argparse

    from graft.serving.http import serve_cli

    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    args = parser.parse_args([str(tiny_llama), "--served-model-name", "plain",
                              "--header-timeout-s", "0.5", "--request-body-timeout-s", "0.5",
                              "--max-header-bytes", "4096", "--limit-concurrency", "8",
                              "--max-model-len", "128", "--num-kv-blocks", "32"])
    with LiveServer(serve_cli.build(args), **serve_cli.uvicorn_options(args)) as live:
        yield live


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
                                     b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: 1"])
def test_half_sent_headers_time_out(server, partial):
    reply, took = _talk(server, partial)
    assert reply.startswith(b"HTTP/1.1 408") and took < 3.0


def test_keep_alive_connection_gets_a_fresh_header_deadline(server):
    request = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    reply, took = _talk(server, request + b"GET /health HTTP/1.1\r\n")  # then stalls
    assert reply.startswith(b"HTTP/1.1 200") and b"408" in reply.split(b"\r\n\r\n", 1)[1]
    assert took < 3.0


def test_slow_body_times_out(server):
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json"
            b"\r\ncontent-length: 1000\r\n\r\n{\"model\":")
    reply, took = _talk(server, head)
    assert reply.startswith(b"HTTP/1.1 408") and b"request_timeout" in reply
    assert took < 3.0


def test_oversized_headers_are_refused(server):
    # h11 refuses once it buffers more than the limit without a complete header block
    reply, _ = _talk(server, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 8000)
    assert reply.startswith(b"HTTP/1.1 400")  # not the 408: refused before the deadline


def test_a_whole_request_still_works(server):
    reply, _ = _talk(server, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b'{"status":"ok"}')
