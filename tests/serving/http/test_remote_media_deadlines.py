"""Remote image hosts that are slow or silent: one deadline covers a fetch's headers and body
and all of a request's fetches, and slow hosts never hold up text requests or requests with
local images (the remote fetches have their own pool). Only 127.0.0.1 receives traffic."""

import http.server
import threading
import time

import httpx
import pytest

from graft.errors import RequestError
from graft.serving.multimodal import remote_media as R
from tests.serving.http.loopback_dns import no_dns


def _slow_server(monkeypatch, reply: bytes, pause_s: float):
    """A loopback server that answers `reply` one byte every `pause_s` seconds (loopback made
    "public" for the test), as a host trickling its status line and headers would."""
    import socket

    monkeypatch.setattr(R, "resolve", no_dns)
    monkeypatch.setattr(R, "is_public_address", lambda ip: ip.is_loopback)
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve():
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            for byte in reply:
                if stop.wait(pause_s):
                    return
                conn.sendall(bytes([byte]))

    threading.Thread(target=serve, daemon=True).start()
    return listener, stop


@pytest.mark.parametrize("reply", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n" + b"X-Slow: y\r\n" * 200 + b"\r\nPNG!",
    b"HTTP/1.1 200 OK\r\nContent-Length: 400\r\n\r\n" + b"x" * 400,
], ids=["slow-headers", "slow-body"])
def test_one_deadline_over_headers_and_body(monkeypatch, reply):
    listener, stop = _slow_server(monkeypatch, reply, 0.05)  # every read is quick
    port = listener.getsockname()[1]
    start = time.monotonic()
    try:
        with pytest.raises(RequestError, match="could not be fetched"):
            R.fetch_remote(f"http://localhost:{port}/x.png", 10_000, 0.5, 0, (), "p")
        assert time.monotonic() - start < 5.0  # the whole reply takes over 10 s
    finally:
        stop.set()
        listener.close()


class _SilentHost:
    """A loopback host (made "public" for the test) that accepts every connection and answers
    nothing until closed; `url` for an image on it, `conns` the connections so far."""

    def __init__(self, monkeypatch, media, timeout_s: float):
        import socket

        monkeypatch.setattr(R, "resolve", no_dns)
        monkeypatch.setattr(R, "is_public_address", lambda ip: ip.is_loopback)
        monkeypatch.setattr(media, "allow_remote_media", True)
        monkeypatch.setattr(media, "remote_timeout_s", timeout_s)
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.conns, self.release = [], threading.Event()
        self.url = f"http://localhost:{self.listener.getsockname()[1]}/x.png"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.release.is_set():
            try:
                self.conns.append(self.listener.accept()[0])
            except OSError:
                return

    def wait_for(self, n: int):  # the fetches are under way (no timing assumption)
        while len(self.conns) < n:
            time.sleep(0.05)

    def close(self):
        import socket

        self.release.set()
        self.listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(); close alone does not
        self.listener.close()
        for conn in self.conns:
            conn.close()


def _image_chat(*urls: str) -> dict:
    return {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": u}} for u in urls]}]}


def test_slow_image_hosts_never_hold_up_text_requests(live_server, monkeypatch):
    """More image requests to a host that never answers than the default thread pool has
    workers: a plain text request is still answered while they all wait."""
    from concurrent.futures import ThreadPoolExecutor

    host = _SilentHost(monkeypatch, live_server.app.state.ctx.settings.media, 300.0)
    n = min(32, (__import__("os").cpu_count() or 1) + 4) + 2  # asyncio's default pool, +2
    with ThreadPoolExecutor(n) as clients:
        pending = [clients.submit(httpx.post, live_server.url + "/v1/chat/completions",
                                  json=_image_chat(host.url), timeout=600) for _ in range(n)]
        try:
            host.wait_for(6)
            text = httpx.post(live_server.url + "/v1/chat/completions", timeout=120, json={
                "model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 2})
            assert text.status_code == 200, text.text
            assert not any(p.done() for p in pending)  # the image fetches still wait
        finally:
            host.close()
        assert all(p.result().status_code == 400 for p in pending)


def test_slow_image_hosts_never_hold_up_local_images(live_server, monkeypatch):
    """24 requests whose image host never answers, three times the media pool's threads: a
    request with an inline image is answered while they all wait (remote fetches have their
    own bounded pool); they fail once the host is gone."""
    from concurrent.futures import ThreadPoolExecutor

    from PIL import Image

    from graft.serving.multimodal.media import to_data_url

    host = _SilentHost(monkeypatch, live_server.app.state.ctx.settings.media, 300.0)
    with ThreadPoolExecutor(24) as clients:
        pending = [clients.submit(httpx.post, live_server.url + "/v1/chat/completions",
                                  json=_image_chat(host.url), timeout=600) for _ in range(24)]
        try:
            host.wait_for(R.REMOTE_FETCH_WORKERS)  # every remote thread is taken
            local = httpx.post(live_server.url + "/v1/chat/completions", timeout=120,
                               json=_image_chat(to_data_url(Image.new("RGB", (32, 32), "red"))))
            assert local.status_code == 200, local.text
            assert not any(p.done() for p in pending)
            assert len(host.conns) == R.REMOTE_FETCH_WORKERS  # the rest wait in the queue
        finally:
            host.close()
        assert all(p.result().status_code == 400 for p in pending)


def test_one_deadline_for_all_of_a_requests_fetches(live_server, monkeypatch):
    """Four images from a host that sends each in 0.6 s, at a 1 s deadline: each alone would
    make it, all four (2.4 s) do not; the request fails at its deadline, on the second."""
    import io

    from PIL import Image

    png = io.BytesIO()
    Image.new("RGB", (32, 32), "red").save(png, format="PNG")
    body, served = png.getvalue(), []

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            for i in range(6):  # 0.6 s: the body in six pieces
                time.sleep(0.1)
                self.wfile.write(body[i * len(body) // 6:(i + 1) * len(body) // 6])
                self.wfile.flush()
            served.append(self.path)

        def log_message(self, *args):
            pass

    ctx = live_server.app.state.ctx
    monkeypatch.setattr(ctx.settings, "limit_images_per_prompt", 4)
    monkeypatch.setattr(R, "resolve", no_dns)
    monkeypatch.setattr(R, "is_public_address", lambda ip: ip.is_loopback)
    monkeypatch.setattr(ctx.settings.media, "allow_remote_media", True)
    monkeypatch.setattr(ctx.settings.media, "remote_timeout_s", 1.0)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://localhost:{server.server_address[1]}/x.png"
    try:
        alone = httpx.post(live_server.url + "/v1/chat/completions", timeout=60, json=_image_chat(url))
        assert alone.status_code == 200, alone.text
        resp = httpx.post(live_server.url + "/v1/chat/completions", timeout=60,
                          json=_image_chat(*[url] * 4))
    finally:
        server.shutdown()
        server.server_close()
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "image_fetch_failed"
    assert len(served) == 2  # the one alone, and the first of the four
