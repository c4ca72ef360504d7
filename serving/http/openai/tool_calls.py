"""Model output -> OpenAI `tool_calls`, as a stream of chat deltas.

Every reader turns output text, piece by piece (`feed`, then `finish`), into the `delta`
dicts of chat.completion.chunk events: `{"content": ...}` and `{"tool_calls": [...]}` (the
first one of a call carries index, id, type and name, the next ones its arguments). A
non-streaming answer is the same deltas put together (`assemble`), so both agree by
construction.

- HermesReader ("auto", `--tool-call-parser hermes`, the default): `<tool_call>{"name": ..,
  "arguments": {..}}</tool_call>` blocks, the format of Hermes models and the Qwen2.5/Qwen3
  templates; the text outside the blocks is the content (whitespace at its ends dropped). A
  block that is not such JSON, or names a function not offered, stays in the content as the
  text it is.
- Llama3JsonReader ("auto", `--tool-call-parser llama3_json`): Llama 3.1-3.3's calls, an answer
  that is JSON objects `{"name": .., "parameters": {..}}` (separated by `;` where there are
  several), read whole; an answer that does not start with `{`, or is not all such calls, is
  the content.
- CallListReader ("required"): the whole output is a JSON array of {name, arguments}.
- NamedReader (a named function): the whole output is that function's arguments object.
"""

from __future__ import annotations

import json
import uuid

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _dumps(arguments: dict) -> str:
    return json.dumps(arguments, ensure_ascii=False)


class _Calls:
    """Numbers the calls a reader finds and writes their deltas."""

    def __init__(self):
        self.count = 0

    def start(self, name: str, arguments: str = "") -> list[dict]:
        head = {"index": self.count, "id": new_call_id(), "type": "function",
                "function": {"name": name, "arguments": ""}}
        self.count += 1
        deltas = [{"tool_calls": [head]}]
        if arguments:
            deltas += self.more(arguments)
        return deltas

    def more(self, arguments: str) -> list[dict]:
        return [{"tool_calls": [{"index": self.count - 1, "function": {"arguments": arguments}}]}]


def _call(value, names: list[str]) -> tuple[str, str] | None:
    """(name, arguments JSON) of one parsed call object, or None when it is not a call of
    one of `names`."""
    if not isinstance(value, dict) or value.get("name") not in names:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        arguments = _loads(arguments)
    return (value["name"], _dumps(arguments)) if isinstance(arguments, dict) else None


def _loads(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def partial_tag(text: str, tag: str) -> int:
    """Length of the longest end of `text` that begins `tag` (to be held back)."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class HermesReader:
    def __init__(self, names: list[str]):
        self.names = names
        self.calls = _Calls()
        self.pending = ""  # text not yet turned into deltas
        self.in_block = False
        self.held_space = ""  # content whitespace kept until more content follows it
        self.started = False  # content went out already (leading whitespace is dropped)

    @property
    def called(self) -> bool:
        return self.calls.count > 0

    def feed(self, text: str) -> list[dict]:
        self.pending += text
        out: list[dict] = []
        while True:
            if self.in_block:
                end = self.pending.find(CLOSE)
                if end < 0:
                    return out
                out += self._block(self.pending[:end], closed=True)
                self.pending = self.pending[end + len(CLOSE):]
                self.in_block = False
                continue
            start = self.pending.find(OPEN)
            if start < 0:
                keep = partial_tag(self.pending, OPEN)
                cut = len(self.pending) - keep
                out += self._content(self.pending[:cut])
                self.pending = self.pending[cut:]
                return out
            out += self._content(self.pending[:start])
            self.pending = self.pending[start + len(OPEN):]
            self.in_block = True

    def finish(self) -> list[dict]:
        """Deltas for what is left once the output is complete (an unclosed last block is a
        call when its JSON is complete, as vLLM reads it)."""
        rest, self.pending = self.pending, ""
        if self.in_block:
            self.in_block = False
            return self._block(rest, closed=False)
        return self._content(rest)

    def _block(self, body: str, closed: bool) -> list[dict]:
        call = _call(_loads(body.strip()), self.names)
        if call is None:
            return self._content(OPEN + body + (CLOSE if closed else ""))
        return self.calls.start(*call)

    def _content(self, text: str) -> list[dict]:
        if not self.started:
            text = text.lstrip()
        body = text.rstrip()
        if not body:
            self.held_space += text
            return []
        out = self.held_space + body
        self.held_space = text[len(body):]
        self.started = True
        return [{"content": out}]


class Llama3JsonReader:
    def __init__(self, names: list[str]):
        self.names = names
        self.calls = _Calls()
        self.text = ""
        self.calling: bool | None = None  # decided by the answer's first character

    @property
    def called(self) -> bool:
        return self.calls.count > 0

    def feed(self, text: str) -> list[dict]:
        self.text += text
        if self.calling is None and self.text.strip():
            self.calling = self.text.lstrip().startswith("{")
        if self.calling is False:  # plain text: it streams as it comes
            out, self.text = self.text, ""
            return [{"content": out}] if out else []
        return []

    def finish(self) -> list[dict]:
        text, self.text = self.text, ""
        found = _json_calls(text, self.names) if self.calling else None
        if not found:
            return [{"content": text}] if text else []
        return [delta for name, arguments in found for delta in self.calls.start(name, arguments)]


def _json_calls(text: str, names: list[str]) -> list[tuple[str, str]] | None:
    """The calls of `text`, JSON objects separated by `;` (and whitespace), or None when it is
    anything else."""
    decoder, at, found = json.JSONDecoder(), 0, []
    while True:
        while at < len(text) and (text[at].isspace() or (found and text[at] == ";")):
            at += 1
        if at == len(text):
            return found or None
        try:
            value, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            return None
        call = _call(value, names)
        if call is None:
            return None
        found.append(call)


class CallListReader:
    """The output of tool_choice "required" (guided_json: an array of calls), read whole."""

    def __init__(self, names: list[str]):
        self.names = names
        self.calls = _Calls()
        self.text = ""

    @property
    def called(self) -> bool:
        return self.calls.count > 0

    def feed(self, text: str) -> list[dict]:
        self.text += text
        return []

    def finish(self) -> list[dict]:
        value = _loads(self.text)  # None when max_tokens cut it short
        found = ([_call(item, self.names) for item in value]
                 if isinstance(value, list) and value else [None])
        if None in found:  # not calls: the text is all there is
            return [{"content": self.text}] if self.text else []
        return [delta for name, arguments in found for delta in self.calls.start(name, arguments)]


class NamedReader:
    """The output of a named tool_choice: the arguments of that function, streamed as they
    come (the schema held them to the function's parameters)."""

    def __init__(self, name: str):
        self.name = name
        self.calls = _Calls()
        self.called = True

    def feed(self, text: str) -> list[dict]:
        if not self.calls.count:
            return self.calls.start(self.name, text)
        return self.calls.more(text) if text else []

    def finish(self) -> list[dict]:
        return [] if self.calls.count else self.calls.start(self.name)


TOOL_CALL_PARSERS = {"hermes": HermesReader, "llama3_json": Llama3JsonReader}  # vLLM's names


def reader_for(plan, parser: str = "hermes"):
    """The output reader of a ToolPlan (None: plain text); `parser` reads "auto"'s calls."""
    if plan.mode == "auto":
        return TOOL_CALL_PARSERS[parser](plan.names)
    if plan.mode == "required":
        return CallListReader(plan.names)
    if plan.mode == "named":
        return NamedReader(plan.named)
    return None


def assemble(deltas: list[dict]) -> tuple[str | None, list[dict]]:
    """(content or None, tool_calls) of a message, from its deltas."""
    content: str | None = None
    calls: list[dict] = []
    for delta in deltas:
        if "content" in delta:
            content = (content or "") + delta["content"]
        for part in delta.get("tool_calls", ()):
            if "id" in part:
                calls.append({"id": part["id"], "type": "function",
                              "function": dict(part["function"])})
            else:
                calls[part["index"]]["function"]["arguments"] += part["function"]["arguments"]
    return content, calls
