"""The same images and question build the same user text in graft chat, graft eval, the server
and the exported HF processor's chat template: `<image>\\n<image>\\nQ` (one marker line per
image before the question), so none of them answers a different prompt."""

import jinja2
import pytest
from PIL import Image

from graft.image_prompt import with_image_markers

QUESTION = "Which is bigger?"


def _chat(n):
    from graft.chat_cli import Conversation

    messages, _ = Conversation().ask(QUESTION, [Image.new("RGB", (4, 4))] * n)
    return messages[-1]["content"]


def _eval(n, tmp_path):
    from graft.evals.dataset import _build
    from graft.evals.task import TaskSpec

    names = [f"{i}.png" for i in range(n)]
    for name in names:
        Image.new("RGB", (4, 4)).save(tmp_path / name)
    record = {"id": "a", "image": names, "question": QUESTION, "answer": "x"}
    return _build(record, TaskSpec(), tmp_path, "t.jsonl:1", set())[0].prompt


def _parts(n):
    return [{"type": "image_url", "image_url": {"url": f"data:{i}"}} for i in range(n)] + [
        {"type": "text", "text": QUESTION}]


def _serve(n):
    import json

    from graft.serving.http.openai.openai_chat import parse_chat_request, to_chat_messages

    req = parse_chat_request(json.dumps({"model": "m", "messages": [
        {"role": "user", "content": _parts(n)}]}).encode())
    return to_chat_messages(req.messages)[0][0]["content"]


def _exported(n):
    from graft.interop.export_llava import multimodal_chat_template

    template = multimodal_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    parts = [{"type": "image"} if p["type"] == "image_url" else p for p in _parts(n)]
    return jinja2.Environment().from_string(template).render(
        messages=[{"role": "user", "content": parts}])


@pytest.mark.parametrize("n", [1, 2, 3])
def test_every_path_builds_the_same_prompt(n, tmp_path):
    want = "<image>\n" * n + QUESTION
    assert with_image_markers(QUESTION, n) == want
    assert _chat(n) == want
    assert _eval(n, tmp_path) == want
    assert _serve(n) == want
    assert _exported(n) == want


def test_text_that_places_its_markers_is_kept():
    assert with_image_markers("a <image> b", 1) == "a <image> b"
    assert with_image_markers(QUESTION, 0) == QUESTION
