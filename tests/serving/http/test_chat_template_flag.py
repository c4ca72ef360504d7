"""`graft serve --chat-template` (vLLM's flag): a Jinja file or the template's text replaces
the LLM tokenizer's template for every chat; a missing file or a template that does not
render stops the server in one line."""

import argparse

import httpx
import pytest

from graft.errors import GraftConfigError
from graft.serving.http import serve_cli
from tests.serving.http.conftest import LiveServer

TEMPLATE = ("{# a real template is longer than a file name may be: " + "x" * 300 + " #}"
            "{% for m in messages %}CUSTOM {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}ANSWER:{% endif %}")


def _build(llm, *extra):
    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    return serve_cli.build(parser.parse_args([str(llm), "--served-model-name", "plain",
                                              "--num-kv-blocks", "32", *extra]))


@pytest.mark.parametrize("as_file", [False, True])
def test_the_template_renders_every_chat(tiny_llama, tmp_path, as_file):
    value = TEMPLATE
    if as_file:
        value = str(tmp_path / "chat.jinja")
        (tmp_path / "chat.jinja").write_text(TEMPLATE)
    with LiveServer(_build(tiny_llama, "--chat-template", value)) as server:
        ids = httpx.post(server.url + "/tokenize", timeout=60, json={
            "model": "plain", "messages": [{"role": "user", "content": "hello there"}],
            "add_generation_prompt": True}).json()["tokens"]
        text = server.app.state.ctx.tokenizer.decode(ids)
        assert text == "CUSTOM hello there\nANSWER:", text
        reply = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
            "model": "plain", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
        assert reply.status_code == 200 and reply.json()["usage"]["prompt_tokens"] == len(
            server.app.state.ctx.tokenizer("CUSTOM hi\nANSWER:")["input_ids"])


@pytest.mark.parametrize("value, words", [
    ("missing/chat.jinja", "--chat-template missing/chat.jinja: no such file"),
    ("{% for m in messages %}", "--chat-template: the template does not render"),
    ("{{ raise_exception('no') }}", "--chat-template: the template does not render")])
def test_a_bad_template_is_one_line(tiny_llama, value, words):
    with pytest.raises(GraftConfigError) as err:
        _build(tiny_llama, "--chat-template", value)
    assert words in str(err.value) and "\n" not in str(err.value)
