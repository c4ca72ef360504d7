"""A reasoning model's thinking, split from its answer (`graft serve --reasoning-parser`, vLLM's
flag and field names): the text up to the end-of-thinking tag goes to the message's
`reasoning`, the rest to `content`, where the tool-call reader (if any) reads it.

- qwen3 (Qwen3, QwQ): the model opens with `<think>` and closes with `</think>`; a
  `<tool_call>` inside the thinking ends it too. With `chat_template_kwargs:
  {"enable_thinking": false}` the template turns thinking off and all the text is content.
- deepseek_r1 (DeepSeek-R1 and its distills): the template opens `<think>` in the prompt, so
  the output has only `</think>`; without one, all the text is reasoning.
- A continued message (continue_final_message) goes on thinking only where its text opens a
  thought it does not close.

A guided request (response_format json, or tools under tool_choice required or named) thinks
first, as in vLLM: its grammar holds from the token after the end tag
(SamplingParams.guided_after_token), where the tokenizer has that tag as one token (Qwen3's
and R1's do). Where it does not, the grammar holds from the first token and all of the text
is content. A stream holds back text that may begin a tag, so a tag cut across two deltas is
still found.
"""

from __future__ import annotations

from dataclasses import dataclass

from graft.serving.http.openai.tool_calls import OPEN, partial_tag


@dataclass(frozen=True)
class ReasoningFormat:
    start: str = "<think>"
    end: str = "</think>"
    reads_enable_thinking: bool = True  # the template's `enable_thinking` can turn it off
    ends_with: str | None = OPEN  # a tag that ends the thinking and stays in content (a call)


FORMATS = {"qwen3": ReasoningFormat(),
           "deepseek_r1": ReasoningFormat(reads_enable_thinking=False, ends_with=None)}


class ReasoningSplitter:
    """feed(text) -> (reasoning, content) of the text so far, holding back a partial tag;
    finish() -> what was held."""

    def __init__(self, fmt: ReasoningFormat):
        self.fmt = fmt
        self.thinking = True
        self.pending = ""

    def feed(self, text: str) -> tuple[str, str]:
        self.pending += text
        if not self.thinking:  # a second end tag is dropped (Qwen3 may repeat it)
            return "", self._content_part(hold=True)
        self.pending = self.pending.replace(self.fmt.start, "")
        ends = [(at, tag) for tag in (self.fmt.end, self.fmt.ends_with)
                if tag and (at := self.pending.find(tag)) >= 0]
        if not ends:
            keep = max(partial_tag(self.pending, tag)
                       for tag in (self.fmt.start, self.fmt.end, self.fmt.ends_with) if tag)
            cut = len(self.pending) - keep
            reasoning, self.pending = self.pending[:cut], self.pending[cut:]
            return reasoning, ""
        at, tag = min(ends)
        reasoning = self.pending[:at]
        self.pending = self.pending[at + (len(tag) if tag == self.fmt.end else 0):]
        self.thinking = False
        return reasoning, self._content_part(hold=True)

    def finish(self) -> tuple[str, str]:
        if self.thinking:
            rest, self.pending = self.pending, ""
            return rest, ""
        return "", self._content_part(hold=False)

    def _content_part(self, hold: bool) -> str:
        self.pending = self.pending.replace(self.fmt.end, "")
        keep = partial_tag(self.pending, self.fmt.end) if hold else 0
        cut = len(self.pending) - keep
        content, self.pending = self.pending[:cut], self.pending[cut:]
        return content


def thinking_format(parser: str | None, tokenizer, req, guided: bool) -> ReasoningFormat | None:
    """How the request's answer thinks, or None where all of its text is content: no parser,
    thinking turned off in the template, a continued message that is not inside a thought, or
    a grammar that must hold from the first token."""
    if parser is None:
        return None
    fmt = FORMATS[parser]
    kwargs = req.chat_template_kwargs or {}
    if fmt.reads_enable_thinking and kwargs.get("enable_thinking", True) is False:
        return None
    if req.continue_final_message and not _open_thought(req.messages[-1].text(), fmt):
        return None
    if guided and end_token(tokenizer, fmt) is None:
        return None
    return fmt


def _open_thought(text: str, fmt: ReasoningFormat) -> bool:
    """Whether the text opens a thought it does not close (a prefill of thinking)."""
    return text.rfind(fmt.start) > text.rfind(fmt.end)


def end_token(tokenizer, fmt: ReasoningFormat) -> int | None:
    """The id of the end tag where the tokenizer has it as one token, else None."""
    ids = tokenizer(fmt.end, add_special_tokens=False)["input_ids"]
    return ids[0] if len(ids) == 1 else None
