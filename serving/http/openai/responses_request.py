"""POST /v1/responses (OpenAI's Responses API), the request side: the body is read as OpenAI
defines it and becomes the chat request it means (instructions a system message; input
messages, past function calls and their outputs as chat messages; `text.format` the
response_format; flat function tools the chat ones), which then runs the chat route's way.
responses_answer.py turns the chat answer back into a Response. A `previous_response_id`
continues a Response the server kept (responses_store.py; none are kept unless it runs with
--responses-store-mb)."""

from __future__ import annotations

import json
import re
from typing import Any, Literal, Union

from pydantic import ConfigDict, PrivateAttr

from graft.serving.http.openai import openai_chat as P
from graft.serving.http.openai.responses_store import ResponseStore


class ResponsesBody(P._Strict):
    """The Responses fields graft reads; other known chat fields (vLLM's sampling extensions)
    go on to the chat request, the rest are ignored as on chat."""
    model_config = ConfigDict(extra="allow")
    model: str
    input: Union[str, list[dict[str, Any]]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Union[Literal["none", "auto", "required"], dict[str, Any], None] = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    stream: bool = False
    store: bool | None = None  # false: this answer is not kept (--responses-store-mb)
    previous_response_id: str | None = None
    metadata: dict[str, Any] | None = None
    seed: int | None = None  # vLLM's extension, as on chat


class ResponsesChat(P.ChatCompletionRequest):
    """The chat request a Responses body means, with the body kept for the answer."""
    _body: ResponsesBody | None = PrivateAttr(default=None)
    _origins: list[str] = PrivateAttr(default_factory=list)  # where each message came from
    _conversation: list[dict] = PrivateAttr(default_factory=list)  # the input items, whole
    _store: ResponseStore | None = PrivateAttr(default=None)  # where the answer is kept, if so


# Responses fields without a chat counterpart here (read above, or not followed), and chat
# fields a Response has no place for
_RESPONSES_ONLY = ("include", "reasoning", "user", "truncation", "background", "prompt",
                   "prompt_cache_key", "service_tier", "safety_identifier", "max_tool_calls",
                   "conversation", "n", "messages", "prompt_logprobs")
_PASSED = ("temperature", "top_p", "tool_choice", "parallel_tool_calls", "stream", "seed")
_ORIGIN = re.compile(r"^messages\[(\d+)\]")


def parse_responses_request(raw: bytes, store: ResponseStore | None = None) -> ResponsesChat:
    body = P.parse_chat_request(raw, ResponsesBody)  # JSON guards, fields named, nulls unset
    previous = _previous(store, body.previous_response_id)
    messages, origins = _messages(body, previous)
    # vLLM's extensions (top_k, ignore_eos, ...) first: what is computed here wins
    chat = {k: v for k, v in (body.model_extra or {}).items() if k not in _RESPONSES_ONLY}
    chat.update(model=body.model, messages=messages)
    for name in _PASSED:
        if name in body.model_fields_set:
            chat[name] = getattr(body, name)
    if body.max_output_tokens is not None:
        chat["max_completion_tokens"] = body.max_output_tokens
    if body.top_logprobs is not None:
        chat.update(logprobs=True, top_logprobs=body.top_logprobs)
    if body.tools:
        chat["tools"] = [_tool(t, i) for i, t in enumerate(body.tools)]
    if isinstance(body.tool_choice, dict):
        chat["tool_choice"] = _named_choice(body.tool_choice)
    fmt = (body.text or {}).get("format")
    if fmt is not None:
        chat["response_format"] = _format(fmt)
    try:
        req = P.parse_chat_request(json.dumps(chat).encode(), ResponsesChat)
    except P.APIError as err:
        raise in_responses_words(err, origins) from None
    req._body, req._origins = body, origins
    req._conversation = previous + _items(body.input)
    if store is not None and store.enabled and body.store is not False:
        req._store = store
    return req


def _previous(store: ResponseStore | None, rid: str | None) -> list[dict]:
    """The conversation of the kept Response `rid` continues (none without one)."""
    if rid is None:
        return []
    if store is None or not store.enabled:
        raise P.APIError("this server keeps no responses (start it with --responses-store-mb); "
                         "send the whole conversation in input", param="previous_response_id",
                         code="previous_response_not_found")
    return kept_response(store, rid, "previous_response_id", "previous_response_not_found")[1]


def kept_response(store: ResponseStore, rid: str, param: str,
                  code: str = "response_not_found") -> tuple[dict, list[dict]]:
    """(the Response `rid`, its conversation) as `store` keeps it, or a 404 naming `param`."""
    found = store.get(rid)
    if found is None:
        held = "the latest --responses-store-mb of them" if store.enabled else "none"
        raise P.APIError(f"response {rid!r} is not kept here (never, or no longer: the server "
                         f"keeps {held})", status=404, type="not_found_error", param=param,
                         code=code)
    return found


def _items(given: str | list[dict]) -> list[dict]:
    return [{"role": "user", "content": given}] if isinstance(given, str) else list(given)


def _messages(body: ResponsesBody, previous: list[dict]) -> tuple[list[dict], list[str]]:
    """The chat messages of instructions + a kept conversation + input, and where each came
    from (for errors)."""
    messages, origins = [], []
    if body.instructions:  # (a kept Response's instructions are not carried over, as OpenAI)
        messages.append({"role": "system", "content": body.instructions})
        origins.append("instructions")
    new = _items(body.input)
    wheres = ["previous_response_id"] * len(previous) + (
        ["input"] if isinstance(body.input, str) else [f"input[{i}]" for i in range(len(new))])
    for item, where in zip(previous + new, wheres):
        kind = item.get("type", "message")
        if kind == "message":
            messages.append({"role": item.get("role"),
                             "content": _content(item.get("content"), where)})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments")}}
            if messages and messages[-1].get("tool_calls"):
                messages[-1]["tool_calls"].append(call)  # one assistant turn, several calls
                continue
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                             "content": output if isinstance(output, str) else json.dumps(output)})
        elif kind == "reasoning":
            continue  # past thinking: the chat templates graft runs drop it between turns
        else:
            raise P.APIError(f"input item type {kind!r} is not supported; send message, "
                             "function_call or function_call_output items", param=where)
        origins.append(where)
    return messages, origins


def _content(content: Any, where: str) -> Any:
    """Responses content parts as chat ones (input_text / output_text -> text, input_image ->
    image_url); a string stays a string, and what is not a list goes on for chat to name."""
    if not isinstance(content, list):
        return content
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": part.get("text")})
        elif kind == "input_image":
            parts.append({"type": "image_url", "image_url": {"url": part.get("image_url")}})
        else:
            raise P.APIError(f"{where}.content[{j}].type {kind!r} is not supported; send "
                             "input_text or input_image parts", param=f"{where}.content[{j}].type")
    return parts


def _tool(tool: dict, i: int) -> dict:
    if tool.get("type") != "function":
        raise P.APIError(f"tools[{i}].type {tool.get('type')!r} is not supported; this server "
                         "runs function tools only", param=f"tools[{i}].type")
    function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
    return {"type": "function", "function": function}


def _named_choice(choice: dict) -> dict:
    if choice.get("type") != "function" or "name" not in choice:
        raise P.APIError("tool_choice must be none, auto, required or {type: function, name}",
                         param="tool_choice")
    return {"type": "function", "function": {"name": choice["name"]}}


def _format(fmt: Any) -> Any:
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        inner = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": inner}
    return fmt  # text / json_object as chat has them; anything else chat refuses


_CALL = re.compile(r"^\.tool_calls\[(\d+)\]\.function")
_CHAT_NAMES = (("max_completion_tokens", "max_output_tokens"),
               ("response_format.json_schema", "text.format"), ("response_format", "text.format"))


def in_responses_words(err: P.APIError, origins: list[str]) -> P.APIError:
    """A chat refusal in the Responses request's words: messages[i] -> input[j] (or
    instructions; a past call's fields -> its function_call item's), max_completion_tokens
    -> max_output_tokens, response_format -> text.format, in `param` and in the message."""
    param, message = err.param or "", err.message
    found = _ORIGIN.match(param)
    if found and int(found[1]) < len(origins):
        origin, rest = origins[int(found[1])], param[found.end():]
        call = _CALL.match(rest)
        if call and origin.startswith("input["):  # merged calls: consecutive items
            origin = f"input[{int(origin[6:-1]) + int(call[1])}]"
            rest = rest[call.end():]
        rest = rest.replace(".image_url.url", ".image_url").replace(".tool_call_id", ".call_id")
        message = message.replace(param, origin + rest).replace(found[0], origin)
        param = origin + rest
    elif param == "messages":
        param = "input"
    for chat_name, ours in _CHAT_NAMES:
        if param.startswith(chat_name):
            param = ours + param[len(chat_name):]
            break
    if err.param and param != err.param:
        message = message.replace(err.param, param)
        if err.param == "messages":  # "the messages text is ..."
            message = message.replace("the messages", "the input")
    for chat_name, ours in _CHAT_NAMES:
        message = message.replace(chat_name, ours)
    return P.APIError(message, status=err.status, type=err.type, param=param or None,
                      code=err.code, headers=err.headers)
