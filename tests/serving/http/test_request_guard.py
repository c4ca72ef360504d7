"""A web page must not drive a local server: bodies that are not JSON get 415 (a `text/plain`
form post needs no CORS preflight), and a server bound to loopback without a key answers only
Host headers naming loopback (DNS rebinding). Also: an empty --api-key is an error, and the
chat page carries CSP and frame headers. The live server binds 127.0.0.1 without a key."""

import argparse

import httpx
import pytest

from graft.errors import GraftConfigError
from graft.serving.http import serve_cli
from graft.serving.http.plumbing.request_guard import allowed_host_names, host_name, is_loopback
from tests.graft.cli_asserts import fails

URL = "/v1/chat/completions"
BODY = b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'


def _error(resp, status, code):
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == code
    return err


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", None])
def test_a_body_that_is_not_json_is_a_415(live_server, content_type):
    headers = {"content-type": content_type} if content_type else {}
    with httpx.Client() as client:  # httpx adds no content type to raw bytes
        resp = client.post(live_server.url + URL, content=BODY, headers=headers, timeout=60)
    assert "Content-Type" in _error(resp, 415, "unsupported_media_type")["message"]


def test_json_with_parameters_is_served(live_server):
    for content_type in ("application/json; charset=utf-8", "Application/JSON"):
        resp = httpx.post(live_server.url + URL, content=BODY, timeout=60,
                          headers={"content-type": content_type})
        assert resp.status_code == 200, resp.text


@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "127.0.0.1.evil.example",
                                  "localhost.evil.example:{port}", "", "[::2]:{port}"])
def test_a_foreign_host_header_is_a_421(live_server, host):
    headers = {"host": host.format(port=live_server.port)}
    _error(httpx.get(live_server.url + "/v1/models", headers=headers), 421, "host_not_allowed")
    resp = httpx.post(live_server.url + URL, content=BODY, timeout=60,
                      headers={**headers, "content-type": "application/json"})
    _error(resp, 421, "host_not_allowed")
    _error(httpx.get(live_server.url + "/", headers=headers), 421, "host_not_allowed")


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "[::1]:{port}",
                                  "localhost", "127.0.0.1", "LOCALHOST:9000", "localhost.:1"])
def test_loopback_host_headers_are_served(live_server, host):
    headers = {"host": host.format(port=live_server.port)}
    assert httpx.get(live_server.url + "/v1/models", headers=headers).status_code == 200


def test_which_hosts_are_answered():
    loop = {"localhost", "127.0.0.1", "[::1]"}
    assert set(allowed_host_names("127.0.0.1", (), [])) == loop
    assert "[::1]" in allowed_host_names("::1", (), [])
    assert "127.0.0.2" in allowed_host_names("127.0.0.2", (), [])
    assert allowed_host_names("127.0.0.1", ("key",), []) == ()  # a key guards it
    assert allowed_host_names("0.0.0.0", (), []) == ()  # served to the network
    assert allowed_host_names("0.0.0.0", (), ["Box.lan."]) == ("box.lan",)
    assert set(allowed_host_names("127.0.0.1", (), ["box.lan"])) == {"box.lan", *loop}
    assert is_loopback("127.3.4.5") and is_loopback("::1") and not is_loopback("0.0.0.0")
    assert [host_name(h) for h in ("LocalHost:80", "[::1]:8000", "[::1]", "a.b", "a.b.:1")] \
        == ["localhost", "[::1]", "[::1]", "a.b", "a.b"]


def test_the_chat_page_has_csp_and_frame_headers(live_server):
    resp = httpx.get(live_server.url + "/")
    assert resp.status_code == 200
    csp = resp.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in csp and "default-src 'self'" in csp
    assert resp.headers["x-frame-options"] == "DENY"


def _args(argv):
    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    return parser.parse_args(argv)


def test_an_empty_api_key_is_an_error(monkeypatch):
    monkeypatch.delenv("GRAFT_API_KEY", raising=False)
    for keys in (["--api-key", ""], ["--api-key", "ok", "--api-key", "  "]):
        with pytest.raises(GraftConfigError, match="--api-key is empty"):
            serve_cli.api_keys(_args(["x", *keys]))
    monkeypatch.setenv("GRAFT_API_KEY", "")
    with pytest.raises(GraftConfigError, match="GRAFT_API_KEY is empty"):
        serve_cli.api_keys(_args(["x"]))
    monkeypatch.setenv("GRAFT_API_KEY", " env ")
    assert serve_cli.api_keys(_args(["x", "--api-key", "k"])) == ("k", "env")


def test_an_empty_api_key_is_one_line_before_loading(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("GRAFT_API_KEY", raising=False)
    from tests.serving.http.conftest import _free_port

    fails(capsys, ["serve", str(tmp_path / "not-loaded"), "--api-key", "",
                   "--port", str(_free_port())], "--api-key is empty")
