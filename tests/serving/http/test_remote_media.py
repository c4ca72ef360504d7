"""Remote image URLs (--allow-remote-media) cannot reach the server's own network: addresses
are classified, every hop (redirects too) is checked, the connection goes to the checked
address, and every refusal reads the same. Only 127.0.0.1 ever receives traffic here: the
"public" side is a fake resolver plus httpx.MockTransport."""

import asyncio
import http.server
import ipaddress
import threading
import time

import httpx
import pytest

from graft.errors import RequestError
from graft.serving.multimodal import remote_media as R
from graft.serving.multimodal.media import MediaConfig, fetch_bytes

PUBLIC_IPS = ["8.8.8.8", "1.1.1.1", "93.184.216.34", "2606:4700:4700::1111",
              "2a00:1450:4001:80b::200e"]
REFUSED_IPS = ["127.0.0.1", "127.8.9.10", "10.1.2.3", "172.16.0.1", "192.168.1.1",
               "169.254.169.254", "100.64.0.1", "0.0.0.0", "224.0.0.1", "239.255.255.250",
               "240.0.0.1", "255.255.255.255", "192.0.2.1", "198.18.0.1", "::1", "::",
               "fe80::1", "fc00::1", "fd12:3456::1", "ff02::1", "::ffff:127.0.0.1",
               "::ffff:10.0.0.1", "64:ff9b::7f00:1", "64:ff9b::a00:1", "2002:7f00:1::1",
               "2002:c0a8:101::1", "2001:db8::1", "2001::1"]


@pytest.mark.parametrize("ip", PUBLIC_IPS)
def test_public_addresses_are_allowed(ip):
    assert R.is_public_address(ipaddress.ip_address(ip))


@pytest.mark.parametrize("ip", REFUSED_IPS)
def test_internal_addresses_are_refused(ip):
    assert not R.is_public_address(ipaddress.ip_address(ip))


def test_domain_allow_list():
    assert R.domain_allowed("cdn.images.example", ("images.example",))
    assert R.domain_allowed("IMAGES.example.", ("images.example",))
    assert not R.domain_allowed("evilimages.example", ("images.example",))
    assert R.domain_allowed("anything.example", ())


# -- a real server on 127.0.0.1: must never be contacted ----------------------------------

def _no_dns(host, port):
    """Literal addresses and localhost only: these tests never send a DNS query anywhere."""
    import socket

    if host == "localhost":
        return [ipaddress.ip_address("127.0.0.1")]
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_NUMERICHOST)
    except socket.gaierror as err:
        raise OSError(f"not a literal address: {host}") from err
    return [ipaddress.ip_address(info[4][0]) for info in infos]


@pytest.fixture
def loopback_server(monkeypatch):
    monkeypatch.setattr(R, "resolve", _no_dns)
    hits = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append((self.path, self.headers["host"]))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"\x89PNG")

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], hits
    server.shutdown()
    thread.join(timeout=10)


CFG = MediaConfig(allow_remote_media=True, remote_timeout_s=2.0)


def _refusal(url, cfg=CFG):
    with pytest.raises(RequestError) as err:
        fetch_bytes(url, cfg, "messages[0].content[0].image_url.url")
    return err.value


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::ffff:127.0.0.1]", "0.0.0.0",
                                  "[::1]", "2130706433"])
def test_loopback_is_refused_without_a_connection(loopback_server, host):
    port, hits = loopback_server
    err = _refusal(f"http://{host}:{port}/x.png")
    assert (err.reason, err.code) == ("invalid", "image_fetch_failed")
    assert hits == []  # refused before connecting


def test_every_refusal_reads_the_same(loopback_server):
    port, _ = loopback_server
    messages = {_refusal(url).message for url in (
        f"http://127.0.0.1:{port}/x.png", "http://127.0.0.1:1/closed-port.png",
        "http://10.0.0.1/x.png", "http://no-such-host.invalid/x.png",
        "http://user:pw@example.com/x.png", "http://[fe80::1]:8080/x")}
    assert len(messages) == 1


def test_the_real_client_connects_to_the_checked_address(loopback_server, monkeypatch):
    port, hits = loopback_server  # let loopback count as public for this one test
    monkeypatch.setattr(R, "is_public_address", lambda ip: ip.is_loopback)
    assert R.fetch_remote(f"http://localhost:{port}/a.png", 100, 2.0, 0, (), "p") == b"\x89PNG"
    assert hits == [("/a.png", f"localhost:{port}")]  # the name in Host, the address dialled


# -- the "public" side: a fake resolver and a mock transport -----------------------------

DNS = {"images.example": ["93.184.216.34"], "cdn.images.example": ["2606:4700::6810:84e5"],
       "internal.example": ["10.0.0.5"], "rebind.example": ["93.184.216.35", "192.168.0.2"]}


@pytest.fixture
def fake_net(monkeypatch):
    """DNS answers from DNS; HTTP answered by `routes[host header]` -> httpx.Response."""
    seen, routes = [], {}

    def resolve(host, port):
        if host not in DNS:
            try:
                return [ipaddress.ip_address(host)]
            except ValueError:
                raise OSError("no such host") from None
        return [ipaddress.ip_address(a) for a in DNS[host]]

    def handler(request):
        seen.append((request.url.host, request.headers["host"],
                     request.extensions.get("sni_hostname")))
        assert not ipaddress.ip_address(request.url.host).is_private  # never an internal hop
        return routes[request.headers["host"]](request)

    monkeypatch.setattr(R, "resolve", resolve)
    monkeypatch.setattr(R, "http_client", lambda timeout_s: httpx.AsyncClient(
        transport=httpx.MockTransport(handler), follow_redirects=False, timeout=timeout_s))
    return seen, routes


def test_public_host_is_fetched_at_the_checked_address(fake_net):
    seen, routes = fake_net
    routes["images.example"] = lambda r: httpx.Response(200, content=b"image-bytes")
    assert R.fetch_remote("https://images.example/a.png", 100, 2.0, 3, (), "p") == b"image-bytes"
    assert seen == [("93.184.216.34", "images.example", "images.example")]


def test_redirects_are_checked_hop_by_hop(fake_net):
    seen, routes = fake_net
    routes["images.example"] = lambda r: httpx.Response(
        302, headers={"location": "https://cdn.images.example/b.png"})
    routes["cdn.images.example"] = lambda r: httpx.Response(200, content=b"ok")
    assert R.fetch_remote("http://images.example/a", 100, 2.0, 3, ("images.example",), "p") \
        == b"ok"
    assert [s[0] for s in seen] == ["93.184.216.34", "2606:4700::6810:84e5"]
    for target in ("http://internal.example/meta", "http://127.0.0.1:9/x",
                   "http://[::1]/x", "http://169.254.169.254/latest/meta-data/"):
        seen.clear()
        routes["images.example"] = lambda r, t=target: httpx.Response(302,
                                                                      headers={"location": t})
        with pytest.raises(RequestError, match="could not be fetched"):
            R.fetch_remote("http://images.example/a", 100, 2.0, 3, (), "p")
        assert len(seen) == 1  # the redirect target was never contacted


@pytest.mark.parametrize("url,domains", [
    ("http://rebind.example/x", ()),  # one private record among public ones
    ("http://elsewhere.example/x", ()),  # does not resolve
    ("http://images.example/x", ("other.example",)),  # not on the allow-list
])
def test_refused_before_any_request(fake_net, url, domains):
    seen, _ = fake_net
    with pytest.raises(RequestError, match="could not be fetched"):
        R.fetch_remote(url, 100, 2.0, 3, domains, "p")
    assert seen == []


def test_redirect_loops_stop(fake_net):
    seen, routes = fake_net
    routes["images.example"] = lambda r: httpx.Response(302, headers={"location": "/again"})
    with pytest.raises(RequestError, match="could not be fetched"):
        R.fetch_remote("http://images.example/a", 100, 2.0, 3, (), "p")
    assert len(seen) == 4  # the first request and three redirects


def test_byte_cap_and_total_deadline(fake_net):
    _, routes = fake_net
    routes["images.example"] = lambda r: httpx.Response(200, content=b"x" * 101)
    with pytest.raises(RequestError) as err:
        R.fetch_remote("http://images.example/big", 100, 2.0, 3, (), "p")
    assert err.value.reason == "too_large"

    async def trickle():  # a byte every 0.2 s, forever: each read is quick, the total is not
        while True:
            await asyncio.sleep(0.2)
            yield b"x"

    routes["images.example"] = lambda r: httpx.Response(200, content=trickle())
    start = time.monotonic()
    with pytest.raises(RequestError, match="could not be fetched"):
        R.fetch_remote("http://images.example/slow", 10_000, 0.6, 3, (), "p")
    assert time.monotonic() - start < 2.0


def test_chat_request_with_a_loopback_image_url(live_server, loopback_server, monkeypatch):
    port, hits = loopback_server
    monkeypatch.setattr(live_server.app.state.ctx.settings.media, "allow_remote_media", True)
    image = {"type": "image_url", "image_url": {"url": f"http://127.0.0.1:{port}/x.png"}}
    resp = httpx.post(live_server.url + "/v1/chat/completions", timeout=60, json={
        "model": "tiny", "messages": [{"role": "user", "content": [image]}]})
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert (err["code"], err["param"]) == ("image_fetch_failed",
                                           "messages[0].content[0].image_url.url")
    assert hits == []


def _slow_server(monkeypatch, reply: bytes, pause_s: float):
    """A loopback server that answers `reply` one byte every `pause_s` seconds (loopback made
    "public" for the test), as a host trickling its status line and headers would."""
    import socket

    monkeypatch.setattr(R, "resolve", _no_dns)
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

        monkeypatch.setattr(R, "resolve", _no_dns)
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
    monkeypatch.setattr(R, "resolve", _no_dns)
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


def test_time_in_the_queue_counts_toward_the_deadline(loopback_server, monkeypatch):
    """A request that waited in the remote pool's queue past its deadline fails without
    connecting to the (here public) host."""
    port, hits = loopback_server
    monkeypatch.setattr(R, "is_public_address", lambda ip: ip.is_loopback)
    assert R.fetch_remote(f"http://localhost:{port}/x.png", 1000, 30.0, 0, (), "p") == b"\x89PNG"
    hits.clear()
    pool = R.RemoteFetchPool(MediaConfig(remote_timeout_s=0.2), workers=1)
    busy = threading.Event()
    try:
        first = pool.submit(busy.wait, 30)
        queued = pool.submit(R.fetch_remote, f"http://localhost:{port}/x.png", 1000, 30.0, 0, (), "p")
        time.sleep(0.3)  # past the queued request's deadline
        busy.set()
        assert first.result(timeout=30)
        with pytest.raises(RequestError, match="could not be fetched"):
            queued.result(timeout=30)
    finally:
        pool.shutdown()
    assert hits == []
