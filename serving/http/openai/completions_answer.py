"""What a text completion's answer looks like (the `shape` responses.py writes): OpenAI's
`text_completion` body or stream chunks, with its logprobs format (tokens, token_logprobs,
top_logprobs, text_offset)."""

from __future__ import annotations

from typing import Any

from graft.serving.http.openai import response_bodies as R
from graft.serving.http.openai.responses import AnswerShape


def completion_logprobs(ids: list[int], entries: list[dict[int, float]], top: int, tokenizer,
                        offset: int) -> tuple[dict[str, Any], int]:
    """(OpenAI completions `logprobs` for output tokens `ids`, the offset after them);
    text_offset counts characters of the answer's text from `offset` on, token by token as
    vLLM counts them, with special tokens adding nothing (the text skips them)."""
    def decode(t: int, skip: bool = False) -> str:
        return tokenizer.decode([t], skip_special_tokens=skip)

    body: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                             "text_offset": []}
    for tid, entry in zip(ids, entries):
        text = decode(tid)
        best = sorted(entry.items(), key=lambda kv: -kv[1])[:top]
        body["tokens"].append(text)
        body["token_logprobs"].append(entry[tid])
        body["top_logprobs"].append({decode(t): lp for t, lp in best})
        body["text_offset"].append(offset)
        offset += len(decode(tid, skip=True))
    return body, offset


class CompletionAnswer(AnswerShape):
    def __init__(self, ctx, job, req):
        super().__init__(ctx, job, req)
        self.top = req.logprobs or 0
        self.id = "cmpl-" + job.request_id.removeprefix("chatcmpl-")
        self.echo = ""
        if req.echo:
            self.echo = (req.prompt if isinstance(req.prompt, str)
                         else ctx.tokenizer.decode(job.prompt_token_ids))
        self.offset = len(self.echo)  # text_offset of the next streamed token

    def _body(self, text: str, reason: str | None, logprobs=None) -> dict[str, Any]:
        return {"id": self.id, "object": "text_completion", "created": self.created,
                "model": self.model, "choices": [{"index": 0, "text": text,
                                                  "logprobs": logprobs,
                                                  "finish_reason": reason}]}

    def _logprobs(self, out, start: int, offset: int) -> tuple[dict[str, Any] | None, int]:
        if out is None or out.logprobs is None:
            return None, offset
        ids = out.token_ids[start:len(out.logprobs)]
        return completion_logprobs(ids, out.logprobs[start:start + len(ids)], self.top,
                                   self.ctx.tokenizer, offset)

    def logprobs(self, out, start: int) -> tuple[dict | None, int]:
        body, self.offset = self._logprobs(out, start, self.offset)
        return body, len(body["tokens"]) if body else 0

    def head(self) -> list[dict]:
        return [self._body(self.echo, None)] if self.echo else []

    def piece(self, delta: str, logprobs: dict | None, n_logprobs: int) -> list[dict]:
        return [self._body(delta, None, logprobs)] if delta or n_logprobs else []

    def tail(self, reason: str | None) -> list[dict]:
        return [self._body("", reason)]

    def whole(self, last, reason: str | None) -> dict:
        text = last.text if last is not None else ""
        body = self._body(self.echo + text, reason, self._logprobs(last, 0, len(self.echo))[0])
        body["usage"] = self._usage(last)
        return body

    def _usage(self, last) -> dict:
        return R.usage(*self.counts(last), last)

    def usage(self, last) -> dict:
        return {"id": self.id, "object": "text_completion", "created": self.created,
                "model": self.model, "choices": [], "usage": self._usage(last)}
