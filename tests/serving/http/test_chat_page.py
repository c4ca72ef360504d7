"""The chat page at / (static, offline, package data) and `graft serve`'s checks before the
model loads: a busy port, a dir that is neither a run dir nor an LLM dir."""

import re
import socket

import httpx
from PIL import Image

from graft.cli import main

PAGE_FILES = {"static/app.js": "javascript", "static/markdown.js": "javascript",
              "static/conversations.js": "javascript", "static/settings.js": "javascript",
              "static/app.css": "text/css"}
# the vendored libraries (tools/fetch_vendor.sh): served from the package, each beside its licence
VENDOR_FILES = {"static/vendor/markdown-it/markdown-it.umd.min.js": "javascript",
                "static/vendor/dompurify/purify.min.js": "javascript",
                "static/vendor/highlight/highlight.min.js": "javascript",
                "static/vendor/katex/katex.min.js": "javascript",
                "static/vendor/katex/katex.min.css": "text/css"}


def test_page_and_assets_are_served(live_server):
    page = httpx.get(live_server.url + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    for path, kind in PAGE_FILES.items():
        assert f'"{path}"' in page.text
        asset = httpx.get(f"{live_server.url}/{path}")
        assert asset.status_code == 200 and kind in asset.headers["content-type"]
        # offline: nothing is fetched from another host
        assert not re.search(r"https?://", asset.text), path
    assert not re.search(r"(src|href)=\"https?://", page.text)
    for path, kind in VENDOR_FILES.items():
        assert f'"{path}"' in page.text
        asset = httpx.get(f"{live_server.url}/{path}")
        assert asset.status_code == 200 and kind in asset.headers["content-type"]
        licence = httpx.get(f"{live_server.url}/{path.rsplit('/', 1)[0]}/LICENSE")
        assert licence.status_code == 200 and len(licence.text) > 200, path
    # every font KaTeX's stylesheet names is shipped (woff2 only)
    css = httpx.get(live_server.url + "/static/vendor/katex/katex.min.css").text
    fonts = set(re.findall(r"url\((fonts/[^)]+)\)", css))
    assert fonts and all(f.endswith(".woff2") for f in fonts)
    for font in fonts:
        assert httpx.get(f"{live_server.url}/static/vendor/katex/{font}").status_code == 200, font
    js = httpx.get(live_server.url + "/static/app.js").text
    for api in ("v1/models", "v1/chat/completions", "metrics"):  # the same OpenAI API
        assert f'"{api}"' in js
    assert httpx.get(live_server.url + "/static/nope.js").status_code == 404


def test_page_is_not_in_the_api_schema(live_server):
    paths = httpx.get(live_server.url + "/openapi.json").json()["paths"]
    assert "/" not in paths and not any(p.startswith("/static") for p in paths)


def test_busy_port_fails_before_loading(tiny_run_dir, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", str(tiny_run_dir), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"--port {port}: cannot listen on 127.0.0.1:{port}" in err and "Traceback" not in err


def test_neither_run_dir_nor_llm_dir(tmp_path, capsys):
    from tests.serving.http.conftest import _free_port

    assert main(["serve", str(tmp_path), "--port", str(_free_port())]) == 2
    err = capsys.readouterr().err
    assert "neither a run dir (graft.yaml) nor an HF LLM dir (config.json)" in err, err
    assert "Traceback" not in err


# a 32x32 red PNG made in the page, handed over as the file/paste handlers do: a data: URL
_RED_IMAGE = """(() => { const c = document.createElement("canvas"); c.width = c.height = 32;
  const g = c.getContext("2d"); g.fillStyle = "#d22"; g.fillRect(0, 0, 32, 32);
  setImage(c.toDataURL("image/png")); return true; })()"""


def _ask(browser, text: str, n_answers: int) -> None:
    browser.js(f"document.getElementById('prompt').value = {text!r}; "
               "document.getElementById('composer').requestSubmit(); true")
    browser.wait_for(f"document.querySelectorAll('.stats').length >= {n_answers} "
                     "|| document.querySelector('.msg.error')")


def _browser_or_skip():
    import pytest

    from tests.serving.http.cdp import NO_CHROMIUM, Browser, find_chromium

    if find_chromium() is None:
        pytest.skip(NO_CHROMIUM)
    return Browser()


def test_page_chats_about_an_image_in_chromium(live_server, tmp_path):
    """A real headless Chromium: the model list, an image, two streamed turns (the second
    resends the image, which then comes from the encoder cache), TTFT and tokens/s shown."""
    import os

    browser = _browser_or_skip()
    try:
        browser.goto(live_server.url + "/")
        assert browser.wait_for("document.getElementById('model')?.value") == "tiny"
        browser.js("document.getElementById('max-tokens').value = 8; true")
        red = tmp_path / "red.png"
        Image.new("RGB", (32, 32), (220, 20, 20)).save(red)
        browser.set_files("#file", [red])  # the file picker, then FileReader -> data: URL
        browser.wait_for("!document.getElementById('preview').hidden")
        _ask(browser, "What colour is it?", 1)
        _ask(browser, "And the border?", 2)
        assert browser.js("document.querySelector('.msg.error')") is None
        stats = browser.js("[...document.querySelectorAll('.stats')].map(s => s.textContent)")
        assert re.match(r"TTFT \d+ ms · [\d.]+ tokens/s · \d+ tokens · image encoded$", stats[0])
        assert stats[1].endswith("image from the encoder cache"), stats
        assert browser.js("document.querySelectorAll('.msg.user img').length") == 1
        # offline: every resource the page loaded came from this server
        loaded = browser.js("performance.getEntriesByType('resource').map(e => e.name)")
        assert loaded and all(u.startswith(live_server.url + "/") for u in loaded), loaded
        browser.screenshot(os.environ.get("GRAFT_CHAT_SCREENSHOT") or tmp_path / "chat.png")
    finally:
        browser.close()


def test_page_picks_the_graft_in_chromium(graft_runs):
    """Several grafts served: the page lists /v1/models and the request goes to the pick."""
    from tests.serving.http.test_http_grafts import _args
    from graft.serving.http import serve_cli
    from tests.serving.http.conftest import LiveServer

    app = serve_cli.build(_args(["--graft", f"sig={graft_runs['sig']}",
                                 "--graft", f"clip={graft_runs['clip']}",
                                 "--served-model-name", "base"]))
    with LiveServer(app) as server:
        browser = _browser_or_skip()
        try:
            browser.goto(server.url + "/")
            browser.wait_for("document.getElementById('model')?.value")
            listed = [m["id"] for m in httpx.get(server.url + "/v1/models").json()["data"]]
            assert browser.js("[...document.querySelectorAll('#model option')].map(o => o.value)") == listed
            assert set(listed) == {"base", "sig", "clip"}
            assert not browser.js("document.getElementById('model-label').hidden")  # a choice
            # llama.cpp's capability names: the bare LLM takes text only, a graft images too
            caps = {m["id"]: m["capabilities"] for m in httpx.get(server.url + "/v1/models").json()["data"]}
            assert caps == {"base": ["completion"], "sig": ["completion", "multimodal"],
                            "clip": ["completion", "multimodal"]}
            for name, shown in (("base", False), ("sig", True)):
                browser.js(f"{{ const m = document.getElementById('model'); m.value = {name!r}; "
                           "m.dispatchEvent(new Event('change')); true }")
                assert browser.js("!document.getElementById('drop').hidden") is shown, name
            browser.js("document.getElementById('model').value = 'clip'; "
                       "document.getElementById('max-tokens').value = 4; true")
            assert browser.js(_RED_IMAGE)
            _ask(browser, "What colour is it?", 1)
            assert browser.js("document.querySelector('.msg.error')") is None
        finally:
            browser.close()
        metrics = httpx.get(server.url + "/metrics").text
        assert 'graft_per_graft_requests_total{graft="clip"} 1' in metrics
        assert 'graft_per_graft_requests_total{graft="sig"} 0' in metrics


def test_page_with_an_api_key_in_chromium(tiny_run_dir):
    """A server started with --api-key: the page says why it lists nothing, then works once
    the key is typed in."""
    from tests.serving.http.test_http_grafts import _args
    from graft.serving.http import serve_cli
    from tests.serving.http.conftest import LiveServer

    app = serve_cli.build(_args([str(tiny_run_dir), "--served-model-name", "tiny",
                                 "--api-key", "sk-test"]))
    with LiveServer(app) as server:
        browser = _browser_or_skip()
        try:
            browser.goto(server.url + "/")
            status = browser.wait_for("document.getElementById('status')?.textContent")
            assert status.startswith("could not list the models:"), status
            browser.js("const k = document.getElementById('key'); k.value = 'sk-test'; "
                       "k.dispatchEvent(new Event('change')); true")
            assert browser.wait_for("document.getElementById('model').value") == "tiny"
            browser.js("document.getElementById('max-tokens').value = 3; true")
            _ask(browser, "hello", 1)
            assert browser.js("document.querySelector('.msg.error')") is None
        finally:
            browser.close()
