"""A chat's tools and tool history, put where the model's chat template expects them.

A template that handles tools (it reads `tools`, as Qwen2.5/Qwen3 and Hermes templates do)
gets them as `apply_chat_template(tools=...)`, and the history as OpenAI sends it: assistant
`tool_calls` (arguments as objects, as templates index them) and `tool` messages. A template
that knows nothing of tools (SmolLM2's, the test tokenizers' plain ChatML) would drop them
silently; there graft writes what Qwen2.5's template writes: the Hermes tool prompt at the end
of the system message, past calls as `<tool_call>` blocks in the assistant's text and tool
results as `<tool_response>` blocks in a user turn.
"""

from __future__ import annotations

import json

from graft.serving.http.openai.openai_chat import APIError
from graft.serving.http.openai.tool_plan import ToolPlan, arguments_object
from graft.template import special_texts

HERMES_TOOLS = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    "{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>')


def template_handles_tools(tokenizer) -> bool:
    """Whether the chat template used with tools reads them (else they would be dropped)."""
    try:
        template = tokenizer.get_chat_template(tools=[{}])
    except Exception:  # noqa: BLE001 - no template at all: encode_chat says so later
        return False
    return "tools" in template


def tool_prompt(tokenizer, messages: list[dict], sent: list, plan: ToolPlan,
                parse_special_tokens: bool) -> tuple[list[dict], list[dict] | None]:
    """(messages for the template, `tools` for apply_chat_template). `messages` are
    to_chat_messages' output for the request's messages `sent` (one per message)."""
    check_outside_text(tokenizer, _outside_text(plan, sent), parse_special_tokens)
    _check_tool_turns(sent)
    calls = [_history_calls(i, msg) for i, msg in enumerate(sent)]
    if template_handles_tools(tokenizer):
        out = []
        for msg, src, called in zip(messages, sent, calls):
            extra = {"tool_calls": called} if called else {}
            if src.role == "tool" and src.tool_call_id is not None:
                extra["tool_call_id"] = src.tool_call_id
            out.append({**msg, **extra})
        return out, plan.tools or None
    return _hermes_messages(messages, calls, plan), None


def _check_tool_turns(sent: list) -> None:
    """A tool message answers a call of the assistant message before it (OpenAI's rule)."""
    open_ids: set[str] | None = None  # the last assistant's call ids, while results may follow
    for i, msg in enumerate(sent):
        if msg.role == "tool":
            if open_ids is None:
                raise APIError(f"messages[{i}]: a tool message must follow an assistant message "
                               "with tool_calls (it answers one of them)",
                               param=f"messages[{i}]", code="invalid_value")
            if open_ids and msg.tool_call_id not in open_ids:
                raise APIError(f"messages[{i}].tool_call_id must be the id of one of the "
                               f"preceding assistant's tool_calls ({', '.join(sorted(open_ids))})",
                               param=f"messages[{i}].tool_call_id", code="invalid_value")
        elif msg.role == "assistant" and msg.tool_calls:
            open_ids = {call.id for call in msg.tool_calls if call.id is not None}
        else:
            open_ids = None


def _history_calls(i: int, msg) -> list[dict]:
    """An assistant message's tool_calls with arguments as dicts (vLLM does the same)."""
    return [{"id": call.id, "type": "function", "function": {
        "name": call.function.name, "arguments": arguments_object(
            call.function.arguments, f"messages[{i}].tool_calls[{j}].function.arguments")}}
            for j, call in enumerate(msg.tool_calls or [])]


def _hermes_messages(messages: list[dict], calls: list[list[dict]],
                     plan: ToolPlan) -> list[dict]:
    out: list[dict] = []
    after_tool = False  # the last turn holds tool results: the next result joins it
    for msg, called in zip(messages, calls):
        if msg["role"] == "tool":
            block = f"<tool_response>\n{msg['content']}\n</tool_response>"
            if after_tool:
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block})
            after_tool = True
            continue
        after_tool = False
        blocks = [f"<tool_call>\n{json.dumps(c['function'], ensure_ascii=False)}\n</tool_call>"
                  for c in called]
        out.append({**msg, "content": "\n".join(filter(None, [msg["content"], *blocks]))})
    if plan.tools:
        listing = "\n".join(json.dumps(t, ensure_ascii=False) for t in plan.tools)
        system = HERMES_TOOLS.format(tools=listing)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + system}
        else:
            out.insert(0, {"role": "system", "content": system})
    return out


def _outside_text(plan: ToolPlan, sent: list) -> list[tuple[str, str]]:
    """(request field, its text) of the tools, past calls and past reasoning."""
    pieces = [(f"tools[{k}]", json.dumps(t)) for k, t in enumerate(plan.tools)]
    pieces += [(f"messages[{i}].tool_calls", json.dumps([c.model_dump() for c in m.tool_calls]))
               for i, m in enumerate(sent) if m.tool_calls]
    pieces += [(f"messages[{i}].reasoning", m.reasoning or m.reasoning_content or "")
               for i, m in enumerate(sent) if m.role == "assistant"]
    return pieces


def check_outside_text(tokenizer, pieces: list[tuple[str, str]],
                       parse_special_tokens: bool) -> None:
    """Tools, past calls and reasoning, and template variables are rendered by the template
    outside the message text. In each (request field, its text), refuse an `<image>` marker
    (an image with no picture) and special-token text, which would become control tokens
    there, as the server keeps typed special-token text plain (--parse-special-tokens-in-text
    allows it)."""
    texts = [] if parse_special_tokens else special_texts(tokenizer)
    for where, text in pieces:
        if "<image>" in text:
            raise APIError(f"{where} must not contain the literal <image>", param=where,
                           code="invalid_value")
        found = next((t for t in texts if t in text), None)
        if found is not None:
            raise APIError(f"{where} contains special-token text {found!r}; remove it",
                           param=where, code="invalid_value")
