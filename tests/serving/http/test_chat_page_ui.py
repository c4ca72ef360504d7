"""The chat page as a person uses it, in headless Chromium: the layout at 1280 px and 400 px
(controls reachable, the text box never a sliver, screenshots checked against the DOM's boxes),
Stop aborting the request on the server, the system prompt, history kept across reloads,
regenerate and copy, markdown rendered without HTML injection, a non-image file refused."""

import json
import os
import time
from pathlib import Path

import pytest
from PIL import Image

from tests.serving.http.test_chat_page import _ask
from tests.serving.http.test_disconnect import _wait_gone, slow_steps  # noqa: F401 (fixture)

CONTROLS = ("#prompt", "#send", "#file", "#reset", "#settings summary")
ACCENT = (0x2E, 0x5B, 0xBA)  # --accent in app.css: the send button's fill
# request bodies the page sends, recorded by wrapping fetch
RECORD = ("{ window.sent = []; const real = window.fetch; window.fetch = (url, opts) => { "
          "if (opts && opts.body) window.sent.push(JSON.parse(opts.body)); return real(url, opts); }; true }")


def _open(width: int, height: int = 800):
    from tests.serving.http.cdp import NO_CHROMIUM, Browser, find_chromium

    if find_chromium() is None:
        pytest.skip(NO_CHROMIUM)
    return Browser(width, height)


def _load(browser, url: str) -> None:
    browser.goto(url + "/")
    browser.wait_for("document.getElementById('model')?.value")


def _set(browser, element_id: str, value) -> None:
    browser.js(f"{{ const e = document.getElementById({element_id!r}); e.value = {json.dumps(value)}; "
               "e.dispatchEvent(new Event('change')); true }")


def test_layout_at_desktop_and_phone_width(live_server, tmp_path):
    boxes = {}
    for width in (1280, 400):
        browser = _open(width)
        try:
            _load(browser, live_server.url)
            assert browser.js("window.innerWidth") == width
            assert browser.js("document.getElementById('model-label').hidden")  # one model: no picker
            assert browser.js("document.documentElement.scrollWidth") <= width  # no sideways scroll
            for selector in CONTROLS:
                box = browser.box(selector)
                assert box["shown"] and box["width"] > 0 and box["height"] > 0, (width, selector)
                assert box["x"] >= 0 and box["right"] <= width and box["bottom"] <= 800, \
                    (width, selector, box)
            boxes[width] = {s: browser.box(s) for s in ("#prompt", "#drop", "#send")}
            assert boxes[width]["#prompt"]["width"] >= 0.55 * width  # never a sliver
            # GRAFT_CHAT_SCREENSHOTS=DIR keeps them (docs/img), else they go with tmp_path
            shot = Path(os.environ.get("GRAFT_CHAT_SCREENSHOTS") or tmp_path) / f"chat-{width}.png"
            browser.screenshot(shot)
        finally:
            browser.close()
        # the screenshot shows the send button where the DOM puts it (not covered, not off-screen)
        image = Image.open(shot).convert("RGB")
        assert image.size == (width, 800)
        send = boxes[width]["#send"]
        assert image.getpixel((int(send["x"] + 6), int(send["y"] + send["height"] / 2))) == ACCENT
    desktop, phone = boxes[1280], boxes[400]
    assert desktop["#drop"]["right"] <= desktop["#prompt"]["x"]  # side by side
    assert phone["#drop"]["bottom"] <= phone["#prompt"]["y"]  # stacked: the text box gets the row


MARKDOWN = ("# Title\n**bold** and `x<y>`\n\n- one\n- two\n\n```\n<b>raw</b>\n```\n"
            "<img src=x onerror=\"window.pwned = 1\">\n[ok](https://example.org/) "
            "[bad](javascript:window.pwned=2)")


def test_markdown_safety_a_non_image_file_and_a_failed_turn(live_server, tmp_path):
    browser = _open(1000)
    try:
        _load(browser, live_server.url)
        out = browser.js(f"""(() => {{ const d = document.createElement('div');
          d.append(renderMarkdown({json.dumps(MARKDOWN)})); document.body.append(d);
          const all = (s) => [...d.querySelectorAll(s)];
          return {{heading: all('h3').map(e => e.textContent), strong: all('strong').map(e => e.textContent),
                   code: all('p code').map(e => e.textContent), items: all('li').map(e => e.textContent),
                   pre: all('pre code').map(e => e.textContent), imgs: all('img').length,
                   bold_tags: all('b').length, links: all('a').map(a => a.href),
                   text: d.textContent}}; }})()""")
        assert out["heading"] == ["Title"] and out["strong"] == ["bold"]
        assert out["code"] == ["x<y>"] and out["items"] == ["one", "two"]
        assert out["pre"] == ["<b>raw</b>"]
        assert out["imgs"] == 0 and out["bold_tags"] == 0  # model output is never HTML
        assert out["links"] == ["https://example.org/"]  # javascript: stays text
        assert "[bad](javascript:window.pwned=2)" in out["text"] and "<img src=x" in out["text"]
        time.sleep(0.2)
        assert browser.js("window.pwned === undefined")
        notes = tmp_path / "notes.txt"
        notes.write_text("not a picture")
        browser.set_files("#file", [notes])
        status = browser.wait_for("document.getElementById('status').textContent.includes('not an image') "
                                  "&& document.getElementById('status').textContent")
        assert status.startswith("notes.txt is not an image (text/plain): pick a PNG")
        assert browser.js("document.getElementById('preview').hidden")
        # a failed turn is shown, forgotten (not resent with the next one), its text kept to retry
        _set(browser, "extra", "{not json")
        browser.js("document.getElementById('prompt').value = 'hello'; "
                   "document.getElementById('composer').requestSubmit(); true")
        error = browser.wait_for("document.querySelector('.msg.error')?.textContent")
        assert error.startswith("error: ") and "JSON" in error
        assert browser.js("document.getElementById('prompt').value") == "hello"
        assert json.loads(browser.js("localStorage.getItem('graft-chat')"))["messages"] == []
        assert not browser.js("document.getElementById('send').hidden")
    finally:
        browser.close()


def test_system_prompt_history_across_reloads_regenerate_and_copy(live_server):
    browser = _open(1000)
    try:
        _load(browser, live_server.url)
        browser.js(RECORD)
        _set(browser, "system", "Be brief.")
        _set(browser, "max-tokens", "3")
        _ask(browser, "hello", 1)
        assert browser.js("document.querySelector('.msg.error')") is None
        first = browser.js("window.sent")[0]
        assert first["messages"] == [{"role": "system", "content": "Be brief."},
                                     {"role": "user", "content": [{"type": "text", "text": "hello"}]}]
        stored = json.loads(browser.js("localStorage.getItem('graft-chat')"))
        answer = stored["messages"][1]["content"]
        # a reload brings back the chat and the settings
        _load(browser, live_server.url)
        browser.wait_for("!!document.querySelector('.msg.assistant .regenerate')")
        assert browser.js("document.getElementById('system').value") == "Be brief."
        assert browser.js("document.getElementById('max-tokens').value") == "3"
        assert browser.js("[...document.querySelectorAll('.msg')].map(m => m.className)") == \
            ["msg user", "msg assistant"]
        # regenerate: the same request again, the answer replaced (greedy: the same text)
        browser.js(RECORD)
        browser.click(".regenerate")
        browser.wait_for("document.querySelectorAll('.stats').length === 1")
        assert browser.js("window.sent")[0]["messages"] == first["messages"]
        assert browser.js("document.querySelectorAll('.msg.assistant').length") == 1
        assert json.loads(browser.js("localStorage.getItem('graft-chat')"))["messages"][1]["content"] == answer
        # copy hands the answer's text to the clipboard
        browser.js("navigator.clipboard.writeText = async (t) => { window.copied = t; }; true")
        browser.click(".copy")
        browser.wait_for("window.copied !== undefined")
        assert browser.js("window.copied") == answer
        assert browser.js("document.querySelector('.copy').textContent") == "copied"
        browser.click("#reset")  # a new chat also clears the stored history
        assert json.loads(browser.js("localStorage.getItem('graft-chat')"))["messages"] == []
    finally:
        browser.close()


def test_stop_aborts_the_request_on_the_server(live_server, slow_steps):  # noqa: F811
    ctx = live_server.app.state.ctx
    aborted0, finished0 = ctx.metrics.aborted.value, ctx.metrics.finished.value
    browser = _open(1000)
    try:
        _load(browser, live_server.url)
        _set(browser, "max-tokens", "150")
        _set(browser, "extra", '{"ignore_eos": true}')  # long enough to be stopped midway
        browser.js("document.getElementById('prompt').value = 'Describe the scene.'; "
                   "document.getElementById('composer').requestSubmit(); true")
        assert browser.wait_for("!document.getElementById('stop').hidden")
        deadline = time.monotonic() + 60
        while slow_steps[0] < 5 and time.monotonic() < deadline:  # tokens are flowing
            time.sleep(0.02)
        browser.click("#stop")
        stats = browser.wait_for("document.querySelector('.stats')?.textContent")
        assert stats.startswith("stopped · ")
        _wait_gone(ctx)
        assert ctx.metrics.aborted.value == aborted0 + 1
        assert ctx.metrics.finished.value == finished0  # it never ran to its end
        assert browser.js("document.getElementById('stop').hidden")
        assert not browser.js("document.getElementById('send').hidden")
    finally:
        browser.close()
