"""The chat page as a person uses it, in headless Chromium: the layout at 1280x800 and 390x844
(controls reachable, the text box never a sliver, the settings panel over the chat, screenshots
checked against the DOM's boxes), Stop aborting the request on the server, the system prompt,
regenerate keeping versions, copy, markdown rendered and sanitised, a non-image file refused.
Conversations, dark mode and a text-only model: test_chat_page_conversations.py."""

import json
import os
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from PIL import Image

from tests.serving.http.test_chat_page import _ask
from tests.serving.http.test_disconnect import _wait_gone, slow_steps  # noqa: F401 (fixture)

CONTROLS = ("#prompt", "#send", "#pick", "#reset", "#settings-toggle", "#theme")
ACCENT = (0x2E, 0x5B, 0xBA)  # --accent in app.css: the send button's fill
# request bodies the page sends, recorded by wrapping fetch
RECORD = ("{ window.sent = []; const real = window.fetch; window.fetch = (url, opts) => { "
          "if (opts && opts.body) window.sent.push(JSON.parse(opts.body)); return real(url, opts); }; true }")


def _open(width: int, height: int = 800):
    from tests.serving.http.cdp import NO_CHROMIUM, Browser, find_chromium

    if find_chromium() is None:
        pytest.skip(NO_CHROMIUM)
    return Browser(width, height)


@contextmanager
def _page(url: str, width: int = 1000, height: int = 800):
    """A browser on the chat page, closed after the block."""
    browser = _open(width, height)
    try:
        _load(browser, url)
        yield browser
    finally:
        browser.close()


def _load(browser, url: str) -> None:
    browser.goto(url + "/")
    browser.wait_for("document.getElementById('model')?.value")


def _set(browser, element_id: str, value) -> None:
    browser.js(f"{{ const e = document.getElementById({element_id!r}); e.value = {json.dumps(value)}; "
               "e.dispatchEvent(new Event('change')); true }")


def test_layout_at_desktop_and_phone_width(live_server, tmp_path):
    boxes = {}
    for width, height in ((1280, 800), (390, 844)):
        with _page(live_server.url, width, height) as browser:
            assert browser.js("window.innerWidth") == width
            assert browser.js("document.getElementById('model-label').hidden")  # one model: no picker
            assert browser.js("document.documentElement.scrollWidth") <= width  # no sideways scroll
            for selector in CONTROLS:
                box = browser.box(selector)
                assert box["shown"] and box["width"] > 0 and box["height"] > 0, (width, selector)
                assert box["x"] >= 0 and box["right"] <= width and box["bottom"] <= height, \
                    (width, selector, box)
            # the file picker's own label is the whole word, never "No fil...hosen"
            assert browser.js("document.getElementById('pick').scrollWidth "
                              "<= document.getElementById('pick').clientWidth")
            boxes[width] = {s: browser.box(s) for s in ("#prompt", "#drop", "#send", "#log")}
            assert boxes[width]["#prompt"]["width"] >= 0.55 * width  # never a sliver
            # GRAFT_CHAT_SCREENSHOTS=DIR keeps them (docs/img), else they go with tmp_path
            shot = Path(os.environ.get("GRAFT_CHAT_SCREENSHOTS") or tmp_path) / f"chat-{width}.png"
            browser.screenshot(shot)
            # the settings open over the chat: it stays where it was
            browser.click("#settings-toggle")
            assert browser.box("#settings")["shown"]
            assert browser.box("#log")["y"] == boxes[width]["#log"]["y"]
            assert browser.box("#settings")["right"] <= width
            browser.click("#log")  # a click elsewhere puts it away
            assert browser.js("document.getElementById('settings').hidden")
            # the conversation list: beside the chat at desktop width, behind ☰ on a phone
            assert browser.js("document.getElementById('sidebar-toggle').offsetParent === null") \
                is (width > 640)
            if width < 640:
                assert browser.box("#sidebar")["right"] <= 0  # out of sight
                browser.click("#sidebar-toggle")
                browser.wait_for("document.getElementById('sidebar').getBoundingClientRect().x === 0")
                assert browser.box("#search")["right"] <= width
        # the screenshot shows the send button where the DOM puts it (not covered, not off-screen)
        image = Image.open(shot).convert("RGB")
        assert image.size == (width, height)
        send = boxes[width]["#send"]
        assert image.getpixel((int(send["x"] + 6), int(send["y"] + send["height"] / 2))) == ACCENT
    desktop, phone = boxes[1280], boxes[390]
    assert desktop["#drop"]["right"] <= desktop["#prompt"]["x"]  # side by side
    assert phone["#drop"]["bottom"] <= phone["#prompt"]["y"]  # stacked: the text box gets the row


MARKDOWN = ("# Title\n**bold** and `x<y>`\n\n- one\n- two\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
            "> quoted\n\n---\n\n~~gone~~ and $x^2$\n\n$$\n\\frac{1}{2}\n$$\n\n"
            "```python\ndef f():\n    return '<b>raw</b>'\n```\n"
            "<script>window.pwned = 3</script><img src=x onerror=\"window.pwned = 1\">\n"
            "[ok](https://example.org/) [bad](javascript:window.pwned=2)")


def test_markdown_rendered_and_sanitised(live_server):
    with _page(live_server.url, 1000) as browser:
        out = browser.js(f"""(() => {{ const d = document.createElement('div'); d.className = 'msg';
          d.append(renderMarkdown({json.dumps(MARKDOWN)})); document.getElementById('log').append(d);
          const all = (s) => [...d.querySelectorAll(s)];
          return {{heading: all('h1').map(e => e.textContent), strong: all('strong').map(e => e.textContent),
                   code: all('p code').map(e => e.textContent), items: all('li').map(e => e.textContent),
                   cells: all('table td').map(e => e.textContent), quote: all('blockquote').length,
                   rule: all('hr').length, struck: all('s').map(e => e.textContent),
                   inline_math: all('.math:not(.display) .katex').length,
                   display_math: all('.math.display .katex-display').length,
                   tex: all('annotation').map(e => e.textContent),
                   pre: all('pre code').map(e => e.textContent),
                   keywords: all('pre .hljs-keyword').map(e => e.textContent),
                   code_buttons: all('pre .copy-code').length, scripts: all('script').length,
                   imgs: all('img').length, handlers: all('[onerror]').length,
                   links: all('a').map(a => [a.href, a.target, a.rel]), text: d.textContent}}; }})()""")
        assert out["heading"] == ["Title"] and out["strong"] == ["bold"]
        assert out["code"] == ["x<y>"] and out["items"] == ["one", "two"]
        assert out["cells"] == ["1", "2"] and out["quote"] == 1 and out["rule"] == 1
        assert out["struck"] == ["gone"]
        assert out["inline_math"] == 1 and out["display_math"] == 1
        assert out["tex"] == ["x^2", "\\frac{1}{2}"]
        assert out["pre"] == ["def f():\n    return '<b>raw</b>'\n"]  # code stays text
        assert out["keywords"] == ["def", "return"] and out["code_buttons"] == 1
        # HTML the model writes stays text: no script, no image, no handler
        assert out["scripts"] == 0 and out["imgs"] == 0 and out["handlers"] == 0
        assert out["links"] == [["https://example.org/", "_blank", "noopener noreferrer"]]
        assert "[bad](javascript:window.pwned=2)" in out["text"] and "<img src=x" in out["text"]
        # the sanitiser every answer goes through strips raw HTML's script and onerror too
        clean = browser.js("""(() => { const f = sanitize('<p>hi<script>window.pwned = 4</script>'
          + '<img src=x onerror="window.pwned = 5"><a href="javascript:window.pwned=6">x</a></p>');
          const d = document.createElement('div'); d.append(f); document.body.append(d);
          return {html: d.innerHTML, scripts: d.querySelectorAll('script').length,
                  handlers: d.querySelectorAll('[onerror]').length}; })()""")
        assert clean["scripts"] == 0 and clean["handlers"] == 0, clean
        assert "javascript:" not in clean["html"] and "<p>hi" in clean["html"]
        time.sleep(0.2)
        assert browser.js("window.pwned === undefined")
        # the copy button on a code block copies the code only
        browser.js("navigator.clipboard.writeText = async (t) => { window.copied = t; }; true")
        browser.click("pre .copy-code")
        assert browser.wait_for("window.copied") == "def f():\n    return '<b>raw</b>'\n"


def test_a_non_image_file_and_a_failed_turn(live_server, tmp_path):
    with _page(live_server.url, 1000) as browser:
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
        assert error.startswith("error: other request fields: not valid JSON"), error
        assert browser.js("document.getElementById('prompt').value") == "hello"
        chats = json.loads(browser.js("localStorage.getItem('graft-chats')"))["chats"]
        assert [c["nodes"] for c in chats] == [{}]
        assert not browser.js("document.getElementById('send').hidden")
        # a field the server refuses: its message, naming the field
        _set(browser, "extra", "")
        _set(browser, "top-p", "0")
        browser.click(".msg.error .retry")
        error = browser.wait_for("document.querySelector('.msg.error')?.textContent")
        assert "top_p" in error, error


def test_sampling_fields_system_prompt_regenerate_versions_and_copy(live_server):
    with _page(live_server.url, 1000) as browser:
        browser.js(RECORD)
        _set(browser, "system", "Be brief.")
        _set(browser, "max-tokens", "3")
        for field, value in (("top-p", "0.9"), ("top-k", "5"), ("min-p", "0.05"),
                             ("presence-penalty", "0.5"),
                             ("frequency-penalty", "0.25"), ("repetition-penalty", "1.1"),
                             ("seed", "7"), ("stop", "END\nSTOP"), ("response-format", "json_object")):
            _set(browser, field, value)
        _ask(browser, "hello", 1)
        assert browser.js("document.querySelector('.msg.error')") is None
        first = browser.js("window.sent")[0]
        assert first["messages"] == [{"role": "system", "content": "Be brief."},
                                     {"role": "user", "content": [{"type": "text", "text": "hello"}]}]
        assert {k: first[k] for k in ("max_tokens", "temperature", "top_p", "top_k", "min_p",
                                      "presence_penalty",
                                      "frequency_penalty", "repetition_penalty", "seed", "stop",
                                      "response_format")} == {
            "max_tokens": 3, "temperature": 0, "top_p": 0.9, "top_k": 5, "min_p": 0.05,
            "presence_penalty": 0.5,
            "frequency_penalty": 0.25, "repetition_penalty": 1.1, "seed": 7, "stop": ["END", "STOP"],
            "response_format": {"type": "json_object"}}
        _set(browser, "response-format", "text")
        shown_answer = "pathOf(currentChat())[1].content"
        answer = browser.js(shown_answer)
        # a reload brings back the chat and the settings
        _load(browser, live_server.url)
        browser.wait_for("!!document.querySelector('.msg.assistant .regenerate')")
        assert browser.js("document.getElementById('system').value") == "Be brief."
        assert browser.js("document.getElementById('top-k').value") == "5"
        assert browser.js("[...document.querySelectorAll('.msg')].map(m => m.className)") == \
            ["msg user", "msg assistant"]
        # regenerate: the same request again, the new answer kept beside the first (1/2, 2/2)
        browser.js(RECORD)
        browser.click(".regenerate")
        browser.wait_for("document.querySelector('.msg.assistant .version')?.textContent === '2/2'")
        assert browser.js("window.sent")[0]["messages"] == first["messages"]
        assert browser.js("document.querySelectorAll('.msg.assistant').length") == 1
        browser.click(".msg.assistant .prev")
        assert browser.js("document.querySelector('.msg.assistant .version').textContent") == "1/2"
        assert browser.js(shown_answer) == answer
        # copy hands the answer's text to the clipboard
        browser.js("navigator.clipboard.writeText = async (t) => { window.copied = t; }; true")
        browser.click(".copy")
        browser.wait_for("window.copied !== undefined")
        assert browser.js("window.copied") == answer
        assert browser.js("document.querySelector('.copy').textContent") == "copied"


def test_stop_aborts_the_request_on_the_server(live_server, slow_steps):  # noqa: F811
    ctx = live_server.app.state.ctx
    aborted0, finished0 = ctx.metrics.aborted.value, ctx.metrics.finished.value
    with _page(live_server.url, 1000) as browser:
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
