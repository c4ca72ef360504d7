"""The chat page's conversations, colour scheme and model awareness, in headless Chromium:
conversations listed, kept across reloads, switched, searched, renamed, exported and deleted;
an edited question branches (versions to flip between); dark mode follows the system and the
toggle; a text-only model gets no image input; a server that went away reads as unreachable,
the typed text is kept, and retry works once it is back."""

import json
import os
from pathlib import Path

from PIL import Image

from tests.serving.http.test_chat_page import _ask
from tests.serving.http.test_chat_page_ui import _load, _open, _page, _set

TITLES = "[...document.querySelectorAll('#chat-list .open')].map(b => b.textContent)"
SHOWN = "[...document.querySelectorAll('.msg .body')].map(b => b.textContent)"


def test_conversations_kept_switched_searched_renamed_exported_deleted(live_server):
    with _page(live_server.url, 1280) as browser:
        _set(browser, "max-tokens", "2")
        _ask(browser, "first question", 1)
        browser.click("#reset")  # a new conversation; the first stays listed
        assert browser.js("document.querySelectorAll('.msg').length") == 0
        _ask(browser, "second question", 1)
        assert browser.js(TITLES) == ["second question", "first question"]
        _load(browser, live_server.url)  # a reload keeps both, and which one was open
        browser.wait_for("document.querySelectorAll('.msg').length === 2")
        assert browser.js(TITLES) == ["second question", "first question"]
        assert browser.js(SHOWN)[0] == "second question"
        browser.click("#chat-list li:nth-child(2) .open")  # switch
        assert browser.js(SHOWN)[0] == "first question"
        assert browser.js("document.querySelector('#chat-list li.current .open').textContent") == \
            "first question"
        _set(browser, "search", "SECOND")  # search titles and message text
        browser.js("document.getElementById('search').dispatchEvent(new Event('input')); true")
        assert browser.js(TITLES) == ["second question"]
        _set(browser, "search", "")
        browser.js("document.getElementById('search').dispatchEvent(new Event('input')); true")
        # rename: the list item becomes a text box; Enter keeps the name across reloads
        browser.click("#chat-list li:nth-child(2) .rename")
        browser.js("{ const b = document.querySelector('.rename-box'); b.value = 'renamed';"
                   " b.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter'})); true }")
        assert browser.js(TITLES) == ["second question", "renamed"]
        # export: the shown conversation as OpenAI messages, and every version kept
        exported = browser.js("exportChat(currentChat())")
        assert exported["title"] == "renamed"
        assert [m["role"] for m in exported["messages"]] == ["user", "assistant"]
        assert exported["messages"][0]["content"] == [{"type": "text", "text": "first question"}]
        browser.click("#chat-list li:nth-child(2) .delete")  # the first click only asks
        assert browser.js(TITLES) == ["second question", "renamed"]
        browser.click("#chat-list li:nth-child(2) .delete")
        assert browser.js(TITLES) == ["second question"]
        _load(browser, live_server.url)
        browser.wait_for("document.querySelectorAll('.msg').length === 2")
        assert browser.js(TITLES) == ["second question"]


def test_the_single_conversation_of_an_older_page_is_carried_over(live_server):
    old = {"messages": [{"role": "user", "content": [{"type": "text", "text": "kept from before"}]},
                        {"role": "assistant", "content": "an old answer"}]}
    with _page(live_server.url) as browser:
        browser.js(f"localStorage.clear(); localStorage.setItem('graft-chat', {json.dumps(json.dumps(old))}); true")
        _load(browser, live_server.url)
        browser.wait_for("document.querySelectorAll('.msg').length === 2")
        assert [t.strip() for t in browser.js(SHOWN)] == ["kept from before", "an old answer"]
        assert browser.js(TITLES) == ["kept from before"]


def test_an_edited_question_branches(live_server):
    with _page(live_server.url, 1000) as browser:
        _set(browser, "max-tokens", "2")
        _ask(browser, "one", 1)
        _ask(browser, "two", 2)
        browser.click(".msg.user:nth-of-type(3) .edit")  # edit the second question
        browser.js("document.querySelector('.edit-box').value = 'two, edited'; true")
        browser.click(".save-edit")
        browser.wait_for("document.querySelectorAll('.stats').length === 2 "
                         "&& document.querySelectorAll('.msg.user')[1].textContent.includes('edited')")
        user = ".msg.user:nth-of-type(3)"
        assert browser.js(f"document.querySelector('{user} .version').textContent") == "2/2"
        browser.click(f"{user} .prev")  # the old question comes back with its own answer
        assert browser.js(SHOWN)[2] == "two"
        assert browser.js("document.querySelectorAll('.msg').length") == 4
        browser.click(f"{user} .next")
        assert browser.js(SHOWN)[2] == "two, edited"
        _load(browser, live_server.url)  # versions survive a reload
        browser.wait_for("document.querySelectorAll('.msg').length === 4")
        assert browser.js(f"document.querySelector('{user} .version').textContent") == "2/2"


BACKGROUND = "getComputedStyle(document.body).backgroundColor"


def test_dark_mode_follows_the_system_and_the_toggle(live_server, tmp_path):
    shots = Path(os.environ.get("GRAFT_CHAT_SCREENSHOTS") or tmp_path)
    with _page(live_server.url, 1280) as browser:
        _set(browser, "max-tokens", "12")
        _ask(browser, "Show a table, some code and a formula.", 1)
        # a rendered answer in the screenshots: markdown the tiny random model cannot write
        browser.js("""{ const body = document.querySelector('.msg.assistant .body');
          body.replaceChildren(renderMarkdown('| colour | hex |\\n|---|---|\\n| red | `#d22` |\\n\\n'
            + '```python\\ndef area(r):\\n    return 3.14159 * r ** 2\\n```\\n\\n'
            + 'The area is $A = \\\\pi r^2$.')); true }""")
        assert browser.js(BACKGROUND) == "rgb(255, 255, 255)"  # headless: light
        browser.screenshot(shots / "chat-light.png")
        browser.call("Emulation.setEmulatedMedia",
                     features=[{"name": "prefers-color-scheme", "value": "dark"}])
        assert browser.js(BACKGROUND) == "rgb(21, 24, 30)"  # follows the system
        browser.screenshot(shots / "chat-dark.png")
        assert browser.js("document.getElementById('theme').dataset.theme") == "auto"
        browser.click("#theme")  # auto -> light: pinned, whatever the system says
        assert browser.js("document.getElementById('theme').dataset.theme") == "light"
        assert browser.js(BACKGROUND) == "rgb(255, 255, 255)"
        browser.click("#theme")  # -> dark, kept across a reload on a light system
        browser.call("Emulation.setEmulatedMedia",
                     features=[{"name": "prefers-color-scheme", "value": "light"}])
        _load(browser, live_server.url)
        assert browser.wait_for("document.getElementById('theme').dataset.theme") == "dark"
        assert browser.js(BACKGROUND) == "rgb(21, 24, 30)"
    # the screenshots show the two schemes (the page's background at a corner)
    for name, colour in (("chat-light.png", (255, 255, 255)), ("chat-dark.png", (21, 24, 30))):
        assert Image.open(shots / name).convert("RGB").getpixel((1270, 400)) == colour, name


def _text_only_app(tiny_llama):
    from graft.serving.http import serve_cli
    from tests.serving.http.test_http_grafts import _args

    return serve_cli.build(_args([str(tiny_llama), "--served-model-name", "plain"]))


def test_text_only_model_and_a_server_that_went_away(tiny_llama):
    from tests.serving.http.conftest import LiveServer

    first = LiveServer(_text_only_app(tiny_llama))
    port = first.port
    with first:
        browser = _open(1000)
        try:
            _load(browser, first.url)
            assert browser.js("document.getElementById('drop').hidden")  # no image input
            assert browser.js("document.getElementById('file').offsetParent") is None
            _set(browser, "max-tokens", "2")
            _ask(browser, "hello", 1)
            assert browser.js("document.querySelector('.msg.error')") is None
        except BaseException:
            browser.close()
            raise
    try:  # the server is gone: the next turn says so and keeps its text
        browser.js("document.getElementById('prompt').value = 'are you there?'; "
                   "document.getElementById('composer').requestSubmit(); true")
        error = browser.wait_for("document.querySelector('.msg.error')?.textContent")
        assert error.startswith("server unreachable"), error
        assert "Failed to fetch" not in error
        assert browser.js("document.getElementById('prompt').value") == "are you there?"
        assert browser.js("document.querySelectorAll('.msg.user').length") == 1  # not kept
        # back on the same port: retry sends the kept text
        second = LiveServer(_text_only_app(tiny_llama))
        second.port, second.url = port, first.url
        second.server.config.port = port
        with second:
            browser.click(".msg.error .retry")
            browser.wait_for("document.querySelectorAll('.stats').length === 2")
            assert browser.js("document.querySelector('.msg.error')") is None
            assert browser.js("document.getElementById('prompt').value") == ""
            assert json.loads(browser.js("JSON.stringify(pathOf(currentChat()).map(n => n.role))")) \
                == ["user", "assistant", "user", "assistant"]
    finally:
        browser.close()
