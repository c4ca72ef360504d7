"""What a chat completion's answer looks like (the `shape` responses.py writes): the JSON body,
or the chat.completion.chunk events of a stream. With --reasoning-parser, the thinking is split
off into `reasoning` first (reasoning.py); with tools, the rest goes through the ToolPlan's
reader (tool_calls.py) into `tool_calls`, streamed as OpenAI streams them."""

from __future__ import annotations

from graft.serving.http.openai import response_bodies as R
from graft.serving.http.openai.reasoning import ReasoningSplitter, thinking_format
from graft.serving.http.openai.responses import AnswerShape
from graft.serving.http.openai.tool_calls import assemble, reader_for
from graft.serving.http.openai.tool_plan import plan_tools


class ChatAnswer(AnswerShape):
    def __init__(self, ctx, job, req):
        super().__init__(ctx, job, req)
        self.top = req.top_logprobs or 0
        self.plan = plan_tools(req)
        self.reader = reader_for(self.plan, ctx.settings.tool_call_parser)  # None: no tools
        fmt = thinking_format(ctx.settings.reasoning_parser, ctx.tokenizer, req,
                              job.sampling_params.guided_grammar is not None)
        self.splitter = ReasoningSplitter(fmt) if fmt is not None else None
        self.show_reasoning = req.include_reasoning
        self.echo = req.echoed()  # goes before the answer, outside the splitter and reader

    def _chunk(self, delta: dict, reason: str | None = None, logprobs=None) -> dict:
        return R.chunk_body(self.job.request_id, self.model, delta, reason, self.created,
                            logprobs)

    def _reason(self, reason: str | None) -> str | None:
        # OpenAI says "tool_calls" when the model stopped after calling ("auto", "required")
        # but "stop" for a function tool_choice named (vLLM follows it); "length" stays
        called = self.reader is not None and self.reader.called and self.plan.mode != "named"
        return "tool_calls" if called and reason == "stop" else reason

    def logprobs(self, out, start: int) -> tuple[dict | None, int]:
        body = self.ctx.logprobs(out, start, self.top, self.as_ids)
        return body, len(body["content"]) if body else 0

    def head(self) -> list[dict]:
        content = None if self.reader is not None else ""  # a tool call has no content
        echo = [self._chunk({"content": self.echo})] if self.echo else []
        return [self._chunk({"role": "assistant", "content": content})] + echo

    def _deltas(self, reasoning: str, content: str, finish: bool = False) -> list[dict]:
        """The deltas of some thinking and some answer text (finish: the reader's last)."""
        deltas = [{"reasoning": reasoning}] if reasoning and self.show_reasoning else []
        if self.reader is None:
            return deltas + ([{"content": content}] if content else [])
        return deltas + self.reader.feed(content) + (self.reader.finish() if finish else [])

    def _split_whole(self, text: str) -> tuple[str, str]:
        if self.splitter is None:
            return "", text
        (r, c), (r2, c2) = self.splitter.feed(text), self.splitter.finish()
        return r + r2, c + c2

    def piece(self, delta: str, logprobs: dict | None, n_logprobs: int) -> list[dict]:
        reasoning, content = self.splitter.feed(delta) if self.splitter else ("", delta)
        deltas = self._deltas(reasoning, content)
        if n_logprobs and not deltas:  # text held back (a tag, a call): its logprobs go now
            deltas = [{"content": ""}] if self.reader is None and self.splitter is None else [{}]
        return [self._chunk(d, None, logprobs if k == 0 else None) for k, d in enumerate(deltas)]

    def tail(self, reason: str | None) -> list[dict]:
        rest = []
        if reason != "deadline":  # a deadline's stream ends with its error event instead
            held = self.splitter.finish() if self.splitter else ("", "")
            rest = self._deltas(*held, finish=True)
        return [self._chunk(d) for d in rest] + [self._chunk({}, self._reason(reason))]

    def whole(self, last, reason: str | None) -> dict:
        text = last.text if last is not None else ""
        logprobs = self.ctx.logprobs(last, 0, self.top, self.as_ids) if last is not None else None
        reasoning, content = self._split_whole(text)
        deltas = None  # fed before _reason, which asks the reader whether the model called
        if self.reader is not None or self.splitter is not None:
            deltas = self._deltas(reasoning, content, finish=True)
        body = R.completion_body(self.job.request_id, self.model, text, self._reason(reason),
                                 *self.counts(last), logprobs, last)
        message = body["choices"][0]["message"]
        if deltas is not None:
            message["content"], calls = assemble(deltas)
            if self.splitter is not None and self.show_reasoning:
                message["reasoning"] = reasoning or None
            if calls:
                message["tool_calls"] = calls
        if self.echo:
            message["content"] = self.echo + (message["content"] or "")
        if self.job.sampling_params.prompt_logprobs is not None:  # vLLM's place for them
            body["prompt_logprobs"] = self.ctx.prompt_logprobs(last)
        return body

    def usage(self, last) -> dict:
        return R.usage_chunk_body(self.job.request_id, self.model, self.created,
                                  *self.counts(last), last)
