"""What a chat completion's answer looks like (the `shape` responses.py writes): the JSON body,
or the chat.completion.chunk events of a stream. With tools, the output goes through the
ToolPlan's reader (tool_calls.py) into `tool_calls`, streamed as OpenAI streams them."""

from __future__ import annotations

from graft.serving.http.openai import openai_chat as P
from graft.serving.http.openai.responses import AnswerShape
from graft.serving.http.openai.tool_calls import assemble, reader_for
from graft.serving.http.openai.tool_plan import plan_tools


class ChatAnswer(AnswerShape):
    def __init__(self, ctx, job, req):
        super().__init__(ctx, job, req)
        self.top = req.top_logprobs or 0
        self.plan = plan_tools(req)
        self.reader = reader_for(self.plan)  # None: plain text, no tools

    def _chunk(self, delta: dict, reason: str | None = None, logprobs=None) -> dict:
        return P.chunk_body(self.job.request_id, self.model, delta, reason, self.created,
                            logprobs)

    def _reason(self, reason: str | None) -> str | None:
        # OpenAI says "tool_calls" when the model stopped after calling; "length" stays
        called = self.reader is not None and self.reader.called
        return "tool_calls" if called and reason == "stop" else reason

    def logprobs(self, out, start: int) -> tuple[dict | None, int]:
        body = self.ctx.logprobs(out, start, self.top)
        return body, len(body["content"]) if body else 0

    def head(self) -> list[dict]:
        content = None if self.reader is not None else ""  # a tool call has no content
        return [self._chunk({"role": "assistant", "content": content})]

    def piece(self, delta: str, logprobs: dict | None, n_logprobs: int) -> list[dict]:
        if self.reader is None:
            deltas = [{"content": delta}] if delta or n_logprobs else []
        else:
            deltas = self.reader.feed(delta)
        if n_logprobs and not deltas:  # text held back by the reader: its logprobs go now
            deltas = [{}]
        return [self._chunk(d, None, logprobs if k == 0 else None) for k, d in enumerate(deltas)]

    def tail(self, reason: str | None) -> list[dict]:
        rest = self.reader.finish() if self.reader is not None and reason != "deadline" else []
        return [self._chunk(d) for d in rest] + [self._chunk({}, self._reason(reason))]

    def whole(self, last, reason: str | None) -> dict:
        text = last.text if last is not None else ""
        logprobs = self.ctx.logprobs(last, 0, self.top) if last is not None else None
        deltas = self.reader.feed(text) + self.reader.finish() if self.reader else None
        body = P.completion_body(self.job.request_id, self.model, text, self._reason(reason),
                                 *self.counts(last), logprobs, last)
        if deltas is not None:
            content, calls = assemble(deltas)
            message = body["choices"][0]["message"]
            message["content"] = content
            if calls:
                message["tool_calls"] = calls
        return body

    def usage(self, last) -> dict:
        return P.usage_chunk_body(self.job.request_id, self.model, self.created,
                                  *self.counts(last), last)
