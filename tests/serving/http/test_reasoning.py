"""--reasoning-parser: the thinking goes to `reasoning`, the answer to `content`, the same
whether the text comes whole or a character at a time; on the server (built from the CLI
flags), a stream's reasoning deltas add up to the non-streamed message."""

import argparse
import json

import httpx
import pytest
import torch

from graft.errors import GraftConfigError
from graft.serving import SamplingParams
from graft.serving.http.openai.reasoning import FORMATS, ReasoningSplitter
from graft.template import encode_chat
from tests.serving.http.conftest import LiveServer, serve_app

ASK = [{"role": "user", "content": "hello"}]  # the tiny model answers it with text

CALL = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'


def _split(fmt: str, text: str, step: int | None) -> tuple[str, str]:
    splitter = ReasoningSplitter(FORMATS[fmt])
    pieces = [text] if step is None else [text[i:i + step] for i in range(0, len(text), step)]
    reasoning, content = "", ""
    for piece in pieces:
        r, c = splitter.feed(piece)
        reasoning, content = reasoning + r, content + c
    r, c = splitter.finish()
    return reasoning + r, content + c


@pytest.mark.parametrize("fmt, text, expected", [
    ("qwen3", "<think>\nplan it\n</think>\n\nthe answer", ("\nplan it\n", "\n\nthe answer")),
    ("qwen3", "<think>still thinking", ("still thinking", "")),
    ("qwen3", "<think>a</think>b</think>c", ("a", "bc")),  # a repeated end tag is dropped
    ("qwen3", "<think>call f" + CALL, ("call f", CALL)),  # a call ends the thinking
    ("qwen3", "<think>x < y and </thin k", ("x < y and </thin k", "")),  # no tag: no cut
    ("deepseek_r1", "plan</think>answer", ("plan", "answer")),
    ("deepseek_r1", "plan" + CALL, ("plan" + CALL, "")),  # R1 calls after thinking only
])
@pytest.mark.parametrize("step", [None, 1, 3])
def test_the_split_does_not_depend_on_how_the_text_arrives(fmt, text, expected, step):
    assert _split(fmt, text, step) == expected


@pytest.fixture(scope="module")
def server(tiny_llama):
    app = serve_app(str(tiny_llama), "--served-model-name", "r1", "--reasoning-parser",
                    "deepseek_r1", "--num-kv-blocks", "32")
    engine = app.state.ctx.engine  # the whole text, before the server's thread owns the engine
    ids = encode_chat(engine.tokenizer, ASK, [], add_generation_prompt=True).input_ids
    (out,) = engine.generate(prompt_token_ids=[ids], sampling_params=SamplingParams(
        temperature=0, max_tokens=12, ignore_eos=True))
    with LiveServer(app) as live:
        live.text = out.text
        yield live


def _ask(server, **fields):
    body = {"model": "r1", "messages": ASK, "max_tokens": 12,
            "temperature": 0, "ignore_eos": True, **fields}
    resp = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    return resp


def _events(resp) -> list[dict]:
    return [json.loads(line[6:]) for line in resp.text.splitlines()
            if line.startswith("data: {")]


def test_a_model_that_never_ends_thinking_answers_all_in_reasoning(server):
    # the random tiny model writes no </think>: R1's rule makes all of it reasoning
    plain = _ask(server, include_reasoning=False).json()["choices"][0]["message"]
    message = _ask(server).json()["choices"][0]["message"]
    assert "</think>" not in server.text and server.text.strip()
    assert message["content"] is None and message["reasoning"] == server.text
    assert plain["content"] is None and "reasoning" not in plain
    deltas = [e["choices"][0]["delta"] for e in _events(_ask(server, stream=True))
              if e["choices"]]
    assert "".join(d.get("reasoning", "") for d in deltas) == message["reasoning"]
    assert not any(d.get("content") for d in deltas)


def test_guided_requests_answer_in_content_without_a_one_token_end_tag(server):
    # the tiny tokenizer spells </think> in pieces: the grammar holds from the first token
    message = _ask(server, response_format={"type": "json_object"}).json()["choices"][0]["message"]
    assert message["content"].startswith("{") and "reasoning" not in message


def test_the_flag_names_the_formats():
    from graft.serving.http import serve_cli

    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["x", "--reasoning-parser", "nope"])
    assert parser.parse_args(["x", "--reasoning-parser", "qwen3"]).reasoning_parser == "qwen3"


def test_thinking_turned_off_or_a_continued_answer_is_all_content(thinking_llm):
    from transformers import AutoTokenizer

    from graft.serving.http.openai import openai_chat as P
    from graft.serving.http.openai.reasoning import thinking_format

    tok = AutoTokenizer.from_pretrained(thinking_llm)
    off = P.parse_chat_request(json.dumps({"model": "m", "messages": ASK, "chat_template_kwargs":
                                           {"enable_thinking": False}}).encode())
    on = P.parse_chat_request(json.dumps({"model": "m", "messages": ASK}).encode())
    assert thinking_format("qwen3", tok, off, guided=False) is None
    assert thinking_format("qwen3", tok, on, guided=False) is FORMATS["qwen3"]
    assert thinking_format("qwen3", tok, on, guided=True) is FORMATS["qwen3"]  # </think>: 1 token
    assert thinking_format("deepseek_r1", tok, off, guided=False) is not None  # no such switch
    assert thinking_format(None, tok, on, guided=False) is None
    for prefill, thinks in (("<think>\nFirst,", True), ("The answer is", False),
                            ("<think>done</think>\n\nSo", False)):
        cont = P.parse_chat_request(json.dumps({"model": "m", "messages": [*ASK, {
            "role": "assistant", "content": prefill}], "add_generation_prompt": False,
            "continue_final_message": True}).encode())
        assert (thinking_format("qwen3", tok, cont, guided=False) is not None) == thinks


@pytest.fixture(scope="module")
def thinking_llm(tiny_llama, tmp_path_factory):
    """The tiny Llama with <think> and </think> as tokens of their own, as Qwen3's are."""
    import shutil

    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("thinking") / "llm"
    shutil.copytree(tiny_llama, out)
    tok = AutoTokenizer.from_pretrained(out)
    tok.add_tokens(["<think>", "</think>"])
    tok.save_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    torch.manual_seed(0)  # the new rows are drawn at random
    model.resize_token_embeddings(len(tok))
    model.save_pretrained(out)
    return out


def _end_id(path) -> int:
    from transformers import AutoTokenizer

    (end,) = AutoTokenizer.from_pretrained(path)("</think>", add_special_tokens=False)["input_ids"]
    return end


def test_a_grammar_after_the_end_of_thinking_holds_from_the_next_token(thinking_llm):
    from graft.serving import Engine, EngineConfig

    engine = Engine.from_pretrained(thinking_llm, EngineConfig(num_kv_blocks=32))
    end = _end_id(thinking_llm)
    ids = encode_chat(engine.tokenizer, ASK, [], add_generation_prompt=True).input_ids
    forced = {end: 100.0}  # the model "thinks" one token: the end tag, first

    def run(**guided):
        params = SamplingParams(temperature=0, max_tokens=24, logit_bias=forced, **guided)
        return engine.generate(prompt_token_ids=[ids], sampling_params=params)[0]

    waited = run(guided_json=True, guided_after_token=end)
    assert waited.token_ids[0] == end and end not in waited.token_ids[1:]  # then the grammar
    assert waited.text.startswith("</think>{")
    at_once = run(guided_json=True)
    assert at_once.token_ids[0] != end and at_once.text.startswith("{")
    assert run().token_ids == [end] * 24  # unguided, the bias wins every step
    with pytest.raises(GraftConfigError, match="guided_after_token"):
        SamplingParams(guided_after_token=end)  # it names when a grammar starts: needs one


def test_a_guided_answer_thinks_first_on_the_server(thinking_llm):
    app = serve_app(str(thinking_llm), "--served-model-name", "q", "--reasoning-parser",
                    "qwen3", "--num-kv-blocks", "32")
    body = {"model": "q", "messages": ASK, "max_tokens": 24, "temperature": 0,
            "logit_bias": {str(_end_id(thinking_llm)): 100}, "response_format":
            {"type": "json_object"}}
    with LiveServer(app) as live:
        message = httpx.post(live.url + "/v1/chat/completions", json=body,
                             timeout=60).json()["choices"][0]["message"]
        off = httpx.post(live.url + "/v1/chat/completions", timeout=60, json={
            **body, "chat_template_kwargs": {"enable_thinking": False}}).json()
    assert message["reasoning"] is None and message["content"].startswith("{")
    assert "</think>" not in message["content"]
    assert off["choices"][0]["message"]["content"].startswith("{")  # no thinking: JSON at once


def test_the_chat_page_shows_the_thinking_in_a_fold(server):
    from tests.serving.http.test_chat_page import _ask as ask_on_page
    from tests.serving.http.test_chat_page_ui import _page, _set

    with _page(server.url) as browser:
        _set(browser, "max-tokens", "12")
        _set(browser, "temperature", "0")
        ask_on_page(browser, "hello", 1)
        fold = "document.querySelector('.msg.assistant details.reasoning')"
        assert browser.js(f"{fold}.querySelector('div').textContent") == server.text
        assert browser.js(f"{fold}.open")  # no answer after it: the thinking stays open
        exported = browser.js("exportChat(currentChat())")["messages"][-1]
        assert exported["reasoning"] == server.text and exported["content"] == ""


def test_past_thinking_reaches_the_template_and_is_checked(tiny_llama):
    from transformers import AutoTokenizer

    from graft.serving.http.openai import openai_chat as P
    from graft.serving.http.openai.tool_plan import plan_tools
    from graft.serving.http.openai.tool_prompt import tool_prompt

    tok = AutoTokenizer.from_pretrained(tiny_llama)
    tok.chat_template = ("{% for m in messages %}{% if m.reasoning_content %}<think>"
                         "{{ m.reasoning_content }}</think>{% endif %}{{ m.content }}\n"
                         "{% endfor %}")

    def prompt(thought, key="reasoning"):
        req = P.parse_chat_request(json.dumps({"model": "m", "messages": [
            *ASK, {"role": "assistant", "content": "hi", key: thought}, *ASK]}).encode())
        messages, _ = P.to_chat_messages(req.messages)
        messages, tools = tool_prompt(tok, messages, req.messages, plan_tools(req), False)
        return encode_chat(tok, messages, [], tools=tools).input_ids

    assert tok.decode(prompt("weighed it")) == "hello\n<think>weighed it</think>hi\nhello\n"
    assert prompt("weighed it", "reasoning_content") == prompt("weighed it")  # vLLM's old name
    for bad, words in (("<|im_start|>", "special-token text"), ("<image>", "<image>")):
        with pytest.raises(P.APIError, match=words) as err:
            prompt(bad)
        assert err.value.param == "messages[1].reasoning"
