"""Reading one job's engine events into an HTTP answer: a JSON completion or an SSE stream.
Either way a client that goes away aborts its request at the engine's next step."""

from __future__ import annotations

import asyncio
import time

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from graft.serving.http.openai import openai_chat as P
from graft.serving.http.openai import response_bodies as R
from graft.serving.http.job import Job


def sink(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue):
    """Thread-safe hand-off from the engine thread to one request's queue."""
    def put(kind: str, payload) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, (kind, payload))
        except RuntimeError:  # loop closed (shutdown): nobody is listening any more
            pass
    return put


def error_response(err: P.APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def watch_disconnect(request: Request, on_gone) -> asyncio.Task:
    """A task that calls on_gone() once the client has gone; cancel it when done answering."""
    async def watch() -> None:
        # After the body, the server's receive() answers only when the client has gone
        # (uvicorn: http.disconnect); tokens flowing never delay noticing it.
        while (await request.receive())["type"] != "http.disconnect":
            pass
        on_gone()
    return asyncio.create_task(watch())


async def next_event(ctx, job: Job, queue: asyncio.Queue) -> tuple[str, object]:
    """The job's next engine event; once the request is older than --request-timeout-s, its
    abort and an ("error", 408) event instead."""
    limit = ctx.settings.request_timeout_s
    if limit is None:
        return await queue.get()
    try:
        return await asyncio.wait_for(queue.get(), job.arrival + limit - time.monotonic())
    except asyncio.TimeoutError:
        ctx.worker.abort(job.request_id)
        ctx.metrics.timed_out.inc()
        return "error", P.APIError(
            f"the answer was not complete within the server's {limit:g} s per request "
            "(--request-timeout-s); ask for fewer tokens (max_tokens)",
            status=408, code="request_timeout")


class AnswerShape:
    """What a shape (chat_answer.ChatAnswer, completions_answer.CompletionAnswer) writes
    for one job: head() and piece()/tail() chunks of a stream with logprobs() beside them,
    usage() for the last chunk, or whole() for a JSON answer. Here: what both keep."""

    def __init__(self, ctx, job: Job, req):
        self.ctx = ctx
        self.job = job
        self.model = req.model
        self.created = int(time.time())
        # vLLM's fields: token ids beside the text; logprob tokens written `token_id:N`
        self.token_ids = bool(getattr(req, "return_token_ids", None))
        self.as_ids = bool(getattr(req, "return_tokens_as_token_ids", None))

    def token_fields(self, body: dict, ids: list[int], last=None, prompt: bool = False) -> dict:
        """vLLM's fields beside the choice of `body`: `stop_reason` once it finished (the stop
        token id or string; None after eos or a length cut), and with return_token_ids the
        answer's token ids `ids` (a chunk's: those since the last chunk) and, with `prompt`
        (a whole answer, a stream's first chunk), the prompt's: a chat's at the top level, a
        text completion's in its choice, where vLLM puts them."""
        choice = body["choices"][0]
        if choice.get("finish_reason") is not None:
            choice["stop_reason"] = last.stop_reason if last is not None else None
        if self.token_ids:
            choice["token_ids"] = ids
            if prompt:
                target = body if body["object"].startswith("chat.") else choice
                target["prompt_token_ids"] = list(self.job.prompt_token_ids)
        return body

    def first(self, out) -> list[dict]:
        """Chunks to send before the first output's (completions: a scored echo)."""
        return []

    def counts(self, last) -> tuple[int, int]:
        """(prompt tokens, output tokens) for usage; `last` None: nothing came out."""
        return len(self.job.prompt_token_ids), len(last.token_ids) if last is not None else 0


async def answer(ctx, request: Request, job: Job, queue: asyncio.Queue, shape,
                 stream_it: bool, options=None) -> Response:
    """The HTTP answer to a submitted job: SSE chunks or one JSON body, as `shape` (a
    ChatAnswer or CompletionAnswer) writes them; `options`: the request's stream_options."""
    if stream_it:
        watcher = watch_disconnect(request, lambda: ctx.worker.abort(job.request_id))
        return StreamingResponse(stream(ctx, job, queue, shape, options, watcher),
                                 media_type="text/event-stream")
    return await complete(ctx, job, queue, request, shape)


async def complete(ctx, job: Job, queue: asyncio.Queue, request: Request, shape,
                   convert=None) -> Response:
    """The JSON answer (`convert`: what becomes of the shape's body first, if anything)."""
    watcher = watch_disconnect(request, lambda: queue.put_nowait(("gone", None)))
    try:
        body = await whole(ctx, job, queue, shape)
    finally:
        watcher.cancel()
    if isinstance(body, Response):
        return body
    return JSONResponse(convert(body) if convert is not None else body)


async def whole(ctx, job: Job, queue: asyncio.Queue, shape) -> dict | Response:
    """The JSON body of the job's answer once it finished, or the Response that ends it
    instead (an error; 499 when a ("gone", None) event says the client went away)."""
    reason, last = None, None
    try:
        while True:
            kind, out = await next_event(ctx, job, queue)
            if kind == "gone":
                ctx.worker.abort(job.request_id)
                return Response(status_code=499)  # nobody reads it; nginx's "client closed"
            if kind == "error":
                return error_response(out)
            if kind == "deadline":
                reason = "deadline"
                break
            last = out
            if out.finished:
                reason = out.finish_reason
                break
    except asyncio.CancelledError:
        ctx.worker.abort(job.request_id)
        raise
    body = shape.whole(last, reason)
    if "choices" in body:  # a chat or text completion (not a Responses API answer)
        shape.token_fields(body, list(last.token_ids) if last is not None else [], last, True)
    if job.kv_export and reason in ("stop", "length"):  # P/D: where the prompt's KV waits
        from graft.serving.http.fleet.pd import answer_params

        body["kv_transfer_params"] = answer_params(ctx, job.request_id)
    return body


class Progress:
    """How far one job's stream got: its last output, and whether it ended (else abort it)."""
    last = None
    done = False


async def stream(ctx, job: Job, queue: asyncio.Queue, shape, options, watcher: asyncio.Task):
    """SSE events; Starlette cancels this generator when the client disconnects. `watcher`
    (watch_disconnect, started by `answer`) aborts the job should the client go before
    this generator ever runs; it is cancelled here once the stream is over. `options`: the
    request's stream_options (None: none)."""
    progress = Progress()
    try:
        async for body in chunks(ctx, job, queue, shape, options, progress):
            yield R.sse(body)
        if options and options.include_usage:
            yield R.sse(shape.usage(progress.last))
        yield R.sse("[DONE]")
    finally:
        watcher.cancel()
        if not progress.done:  # client went away mid-stream: free its KV blocks and cache pins
            ctx.worker.abort(job.request_id)


async def chunks(ctx, job: Job, queue: asyncio.Queue, shape, options, progress: Progress):
    """The chunk bodies of one job's stream, up to its tail (or an error's body), as `shape`
    writes them; `progress` follows it."""
    sent, sent_lp = 0, 0  # characters, and output tokens whose logprobs went out already
    continuous = bool(options and options.continuous_usage_stats)
    ids = {"pending": [], "sent": 0, "first": True}  # return_token_ids: tokens not yet sent

    def annotated(body: dict) -> dict:  # continuous_usage_stats: the usage so far on every chunk
        if continuous:
            body["usage"] = R.usage(*shape.counts(progress.last), progress.last)
        if body.get("choices"):  # token ids ride with the next chunk that has a choice
            shape.token_fields(body, ids["pending"], progress.last, ids["first"])
            ids["pending"], ids["first"] = [], False
        return body

    for body in shape.head():
        yield annotated(body)
    while True:
        kind, out = await next_event(ctx, job, queue)
        if kind == "error":
            progress.done = True
            yield out.body()
            return
        if kind == "deadline":
            progress.done = True
            for body in shape.tail("deadline"):
                yield annotated(body)
            return
        if progress.last is None:
            for body in shape.first(out):
                yield annotated(body)
        progress.last = out
        ids["pending"] += out.token_ids[ids["sent"]:]
        ids["sent"] = len(out.token_ids)
        delta = out.text[sent:]
        sent = len(out.text)
        # logprobs ride with the text they belong to (stop-string hold-back delays both)
        logprobs, n_lp = shape.logprobs(out, sent_lp) if delta or out.finished else (None, 0)
        sent_lp += n_lp
        for body in shape.piece(delta, logprobs, n_lp):
            yield annotated(body)
        if out.finished:
            progress.done = True
            for body in shape.tail(out.finish_reason):
                yield annotated(body)
            return
