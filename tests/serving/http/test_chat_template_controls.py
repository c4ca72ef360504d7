"""vLLM's chat-template controls on /v1/chat/completions and /tokenize: add_generation_prompt,
continue_final_message (assistant prefill) and chat_template_kwargs; the prompt is the one
graft.template.encode_chat renders, and bad values are 400s naming the field."""

import json

import httpx
import pytest

from graft.template import encode_chat

PREFILL = [{"role": "user", "content": "Name a color."},
           {"role": "assistant", "content": "The color is"}]


def _post(server, path, body):
    return httpx.post(server.url + path, json={"model": "plain", **body}, timeout=60)


def _chat(server, **fields):
    resp = _post(server, "/v1/chat/completions", {"messages": PREFILL, "max_tokens": 4,
                                                  "temperature": 0, "ignore_eos": True, **fields})
    assert resp.status_code == 200, resp.text
    return resp.json()


@pytest.mark.parametrize("fields, expect", [
    ({}, {"add_generation_prompt": True}),
    ({"add_generation_prompt": False}, {}),
    ({"add_generation_prompt": False, "continue_final_message": True},
     {"continue_final_message": True}),
])
def test_the_prompt_is_the_template_render_the_fields_ask_for(plain_server, fields, expect):
    ctx = plain_server.app.state.ctx
    ids = encode_chat(ctx.tokenizer, PREFILL, [], **expect).input_ids
    assert _chat(plain_server, **fields)["usage"]["prompt_tokens"] == len(ids)
    tokens = _post(plain_server, "/tokenize", {"messages": PREFILL, **fields}).json()["tokens"]
    assert tokens == ids


def test_a_continued_message_is_what_the_engine_makes_of_that_prompt(plain_server):
    ctx = plain_server.app.state.ctx
    text = ctx.tokenizer.apply_chat_template(PREFILL, continue_final_message=True, tokenize=False)
    assert text.endswith("The color is")  # no end-of-turn: the model goes on with the message
    ids = ctx.tokenizer(text, add_special_tokens=False)["input_ids"]
    # the same prompt ids as a text completion (the server's thread owns the engine)
    completion = _post(plain_server, "/v1/completions", {
        "prompt": ids, "max_tokens": 4, "temperature": 0, "ignore_eos": True}).json()
    reply = _chat(plain_server, add_generation_prompt=False, continue_final_message=True)
    assert reply["choices"][0]["message"]["content"] == completion["choices"][0]["text"]


@pytest.mark.parametrize("fields, param, words", [
    ({"continue_final_message": True}, "continue_final_message", "add_generation_prompt: false"),
    ({"chat_template_kwargs": {"tools": []}}, "chat_template_kwargs", "'tools' is set by"),
    ({"chat_template_kwargs": {"add_generation_prompt": False}}, "chat_template_kwargs",
     "not a template variable"),
    ({"chat_template_kwargs": {"note": "<|im_start|>system"}}, "chat_template_kwargs",
     "special-token text"),
    ({"chat_template_kwargs": {"note": "<image>"}}, "chat_template_kwargs", "<image>"),
    ({"chat_template_kwargs": ["enable_thinking"]}, "chat_template_kwargs", "dictionary"),
    ({"add_generation_prompt": False, "continue_final_message": True,
      "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]},
     "messages[1]", "needs text in the last message"),
])
def test_bad_template_controls_are_400s_naming_the_field(plain_server, fields, param, words):
    body = {"messages": PREFILL, "max_tokens": 2, **fields}
    resp = _post(plain_server, "/v1/chat/completions", body)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == param and words in err["message"] and "\n" not in err["message"], err
    assert _chat(plain_server)["usage"]["completion_tokens"] == 4  # still serving


def test_template_variables_pass_through_unknown_names(plain_server):
    # the tiny ChatML template reads no variable: an unknown one changes nothing, as in HF
    plain = _chat(plain_server)["usage"]["prompt_tokens"]
    assert _chat(plain_server, chat_template_kwargs={"enable_thinking": False}
                 )["usage"]["prompt_tokens"] == plain


def test_echo_puts_the_prefilled_message_before_the_answer(plain_server):
    fields = {"add_generation_prompt": False, "continue_final_message": True}
    answer = _chat(plain_server, **fields)["choices"][0]["message"]["content"]
    echoed = _chat(plain_server, echo=True, **fields)["choices"][0]["message"]["content"]
    assert echoed == "The color is" + answer
    resp = _post(plain_server, "/v1/chat/completions", {
        "messages": PREFILL, "max_tokens": 4, "temperature": 0, "ignore_eos": True,
        "stream": True, "echo": True, **fields})
    events = [json.loads(line[6:]) for line in resp.text.splitlines()
              if line.startswith("data: {")]
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events) == echoed
    asked = [{"role": "user", "content": "hi"}]  # the last message is not the assistant's
    plain = _chat(plain_server, messages=asked)["choices"][0]["message"]["content"]
    assert _chat(plain_server, messages=asked, echo=True)["choices"][0]["message"]["content"] == plain
