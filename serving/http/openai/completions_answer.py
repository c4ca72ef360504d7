"""What a text completion's answer looks like (the `shape` responses.py writes): OpenAI's
`text_completion` body or stream chunks, with its logprobs format (tokens, token_logprobs,
top_logprobs, text_offset)."""

from __future__ import annotations

from typing import Any

from graft.serving.http.openai import response_bodies as R
from graft.serving.http.openai.responses import AnswerShape


def completion_logprobs(ids: list[int], entries: list[dict[int, float]], top: int, tokenizer,
                        offset: int, as_ids: bool = False) -> tuple[dict[str, Any], int]:
    """(OpenAI completions `logprobs` for tokens `ids`, the offset after them);
    text_offset counts characters of the answer's text from `offset` on, token by token as
    vLLM counts them, with special tokens adding nothing (the text skips them)."""
    def decode(t: int, skip: bool = False) -> str:
        return tokenizer.decode([t], skip_special_tokens=skip)

    name = R.token_id_text if as_ids else decode  # vLLM's return_tokens_as_token_ids

    body: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                             "text_offset": []}
    for tid, entry in zip(ids, entries):  # entry None: the prompt's first token
        best = sorted(entry.items(), key=lambda kv: -kv[1])[:top] if entry is not None else None
        body["tokens"].append(name(tid))
        body["token_logprobs"].append(entry[tid] if entry is not None else None)
        body["top_logprobs"].append({name(t): lp for t, lp in best} if best is not None else None)
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
        # echo with logprobs: the prompt's tokens are scored too, and a stream's echo waits
        # for them (the first output)
        self.scored_echo = req.echo and req.logprobs is not None
        self.prompt_logprobs = req.prompt_logprobs is not None  # vLLM's field, in the choice

    def _body(self, text: str, reason: str | None, logprobs=None) -> dict[str, Any]:
        return {"id": self.id, "object": "text_completion", "created": self.created,
                "model": self.model, "choices": [{"index": 0, "text": text,
                                                  "logprobs": logprobs,
                                                  "finish_reason": reason}]}

    def _echo_logprobs(self, out) -> tuple[dict[str, Any] | None, int]:
        """The prompt's part of echo's logprobs (its first token has none), from offset 0."""
        if out is None or out.prompt_logprobs is None:
            return None, len(self.echo)
        return completion_logprobs(out.prompt_token_ids, out.prompt_logprobs, self.top,
                                   self.ctx.tokenizer, 0, self.as_ids)

    def _logprobs(self, out, start: int, offset: int) -> tuple[dict[str, Any] | None, int]:
        if out is None or out.logprobs is None:
            return None, offset
        ids = out.token_ids[start:len(out.logprobs)]
        return completion_logprobs(ids, out.logprobs[start:start + len(ids)], self.top,
                                   self.ctx.tokenizer, offset, self.as_ids)

    def logprobs(self, out, start: int) -> tuple[dict | None, int]:
        body, self.offset = self._logprobs(out, start, self.offset)
        return body, len(body["tokens"]) if body else 0

    def head(self) -> list[dict]:
        return [self._body(self.echo, None)] if self.echo and not self.scored_echo else []

    def first(self, out) -> list[dict]:
        if not self.scored_echo:
            return []
        logprobs, self.offset = self._echo_logprobs(out)
        return [self._body(self.echo, None, logprobs)]

    def piece(self, delta: str, logprobs: dict | None, n_logprobs: int) -> list[dict]:
        return [self._body(delta, None, logprobs)] if delta or n_logprobs else []

    def tail(self, reason: str | None) -> list[dict]:
        return [self._body("", reason)]

    def whole(self, last, reason: str | None) -> dict:
        text = last.text if last is not None else ""
        echoed, offset = self._echo_logprobs(last) if self.scored_echo else (None, len(self.echo))
        logprobs = self._logprobs(last, 0, offset)[0]
        if echoed is not None:
            logprobs = {k: echoed[k] + logprobs[k] for k in echoed} if logprobs else echoed
        body = self._body(self.echo + text, reason, logprobs)
        if self.prompt_logprobs:
            body["choices"][0]["prompt_logprobs"] = self.ctx.prompt_logprobs(last)
        body["usage"] = self._usage(last)
        return body

    def _usage(self, last) -> dict:
        return R.usage(*self.counts(last), last)

    def usage(self, last) -> dict:
        return {"id": self.id, "object": "text_completion", "created": self.created,
                "model": self.model, "choices": [], "usage": self._usage(last)}
