"""Several choices in one answer: `n` > 1 (samples of one prompt) and /v1/completions' list of
prompts. Each choice is its own engine request, submitted as a request of one prompt with
n = 1 is (its seed, if any, plus its sample's number, as vLLM seeds them); the answer joins
them in vLLM's order (index = prompt * n + sample) under one id, with the usage summed (each
prompt's tokens counted once). A choice that fails fails the answer, and the others are
aborted; so is everything when the client goes away."""

from __future__ import annotations

import asyncio

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from graft.serving.engine.sampling_params import SEED_MAX, SEED_MIN
from graft.serving.http.openai import openai_chat as P
from graft.serving.http.openai import response_bodies as R
from graft.serving.http.openai.chat_request import submit_chat
from graft.serving.http.openai.responses import Progress, chunks, watch_disconnect, whole

MAX_CHOICES = 128  # prompts x n in one request


def choice_requests(req) -> list:
    """The one-prompt, n = 1 requests of req's choices, in their answer's order."""
    prompts = req.prompt_requests()
    if len(prompts) * req.n > MAX_CHOICES:
        raise P.APIError(f"{len(prompts)} prompts x n = {req.n} is {len(prompts) * req.n} "
                         f"choices; one request asks for at most {MAX_CHOICES}", param="n")
    if len(prompts) * req.n > 1 and req.kv_transfer_params is not None:
        raise P.APIError("several choices (n > 1 or a list of prompts) cannot go with "
                         "kv_transfer_params (one prefill, one decode); ask for one choice "
                         "per request", param="n" if req.n > 1 else "prompt")
    if req.n == 1:
        return prompts
    # a chat answers one prompt_logprobs (the first sample's): the others do not score the
    # prompt again, so they may take prefix-cache hits (completions carry it in every choice)
    once = isinstance(req, P.ChatCompletionRequest)
    return [p.model_copy(update={"n": 1, "seed": _seed(req.seed, j),
                                 **({"prompt_logprobs": None} if once and j else {})})
            for p in prompts for j in range(req.n)]


def _seed(seed: int | None, j: int) -> int | None:
    if seed is None:
        return None
    return SEED_MIN + (seed + j - SEED_MIN) % (SEED_MAX - SEED_MIN + 1)  # wraps, stays valid


async def submit_all(ctx, parts: list, front, arrival: float) -> list:
    """(Job, queue) of every choice; when one is refused, the ones before it are aborted."""
    subs = []
    try:
        for part in parts:
            subs.append(await submit_chat(ctx, part, front, arrival))
    except BaseException:
        for job, _ in subs:
            ctx.worker.abort(job.request_id)
        raise
    return subs


async def answer_all(ctx, request: Request, req, subs: list, shapes: list) -> Response:
    """The answer of several choices: SSE chunks as they come, or one JSON body."""
    n = req.n
    counted = [i % n == 0 for i in range(len(subs))]  # the first sample of each prompt
    if req.stream:
        watcher = watch_disconnect(request, lambda: _abort(ctx, subs))
        return StreamingResponse(_stream(ctx, subs, shapes, counted, req.stream_options, watcher),
                                 media_type="text/event-stream")
    bodies = await gather(ctx, request, subs, shapes)
    if isinstance(bodies, Response):
        return bodies
    joined = bodies[0]
    joined["choices"] = [dict(b["choices"][0], index=i) for i, b in enumerate(bodies)]
    joined["usage"] = total_usage([b["usage"] for b in bodies], counted)
    return JSONResponse(joined)


async def gather(ctx, request: Request, subs: list, shapes: list) -> list[dict] | Response:
    """The JSON body of every (job, queue) of subs as its shape writes it, in order; or the
    Response of the first that ends in an error (or 499: the client went away), the others
    aborted."""
    queues = [queue for _, queue in subs]
    watcher = watch_disconnect(request, lambda: [q.put_nowait(("gone", None)) for q in queues])
    tasks = [asyncio.ensure_future(whole(ctx, job, queue, shape))
             for (job, queue), shape in zip(subs, shapes)]
    try:
        bodies = []
        for task in tasks:
            body = await task
            if isinstance(body, Response):
                _abort(ctx, subs)
                return body
            bodies.append(body)
        return bodies
    finally:
        watcher.cancel()
        for task in tasks:
            task.cancel()


def total_usage(usages: list[dict], counted: list[bool]) -> dict:
    """The choices' usage summed; prompt tokens only where `counted` (once per prompt)."""
    prompt = sum(u["prompt_tokens"] for u, c in zip(usages, counted) if c)
    body = R.usage(prompt, sum(u["completion_tokens"] for u in usages))
    body["prompt_tokens_details"]["cached_tokens"] = sum(
        u["prompt_tokens_details"]["cached_tokens"] for u, c in zip(usages, counted) if c)
    return body


def _abort(ctx, subs: list) -> None:
    for job, _ in subs:
        ctx.worker.abort(job.request_id)


async def _stream(ctx, subs: list, shapes: list, counted: list[bool], options, watcher):
    """Every choice's chunks, relabelled with its index and the first choice's id, in the
    order they come; then the summed usage and [DONE]. An error's body ends the stream."""
    merged: asyncio.Queue = asyncio.Queue()
    progress = [Progress() for _ in subs]
    first_id = None

    async def pump(i: int) -> None:
        job, queue = subs[i]
        try:
            async for body in chunks(ctx, job, queue, shapes[i], options, progress[i]):
                await merged.put((i, body))
        finally:
            await merged.put((i, None))

    tasks = [asyncio.ensure_future(pump(i)) for i in range(len(subs))]
    try:
        open_ = len(subs)
        while open_:
            i, body = await merged.get()
            if body is None:
                open_ -= 1
                continue
            if "error" in body:
                yield R.sse(body)
                break
            first_id = first_id or body["id"]
            body["id"] = first_id
            for choice in body["choices"]:
                choice["index"] = i
            yield R.sse(body)
        if options and options.include_usage:
            usage = shapes[0].usage(progress[0].last)
            usage["id"] = first_id or usage["id"]
            usage["usage"] = total_usage([R.usage(*s.counts(p.last), p.last)
                                          for s, p in zip(shapes, progress)], counted)
            yield R.sse(usage)
        yield R.sse("[DONE]")
    finally:
        watcher.cancel()
        for task in tasks:
            task.cancel()
        for (job, _), p in zip(subs, progress):
            if not p.done:
                ctx.worker.abort(job.request_id)
