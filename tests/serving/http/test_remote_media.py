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
from tests.serving.http.loopback_dns import no_dns

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

@pytest.fixture
def loopback_server(monkeypatch):
    monkeypatch.setattr(R, "resolve", no_dns)
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
