"""OpenAI-compatible HTTP server: parses, validates and streams; the engine runs elsewhere.

One background thread (EngineWorker) steps the engine; each request reads its outputs from
its own asyncio queue. Image fetching, decoding, hashing and tokenizing run off the loop.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import Depends, FastAPI, Request
from fastapi.responses import (FileResponse, JSONResponse, PlainTextResponse, Response,
                               StreamingResponse)
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from graft.serving.http import openapi_schema
from graft.serving.http import openai_chat as P
from graft.serving.http.auth import APIKeys
from graft.serving.http.context import ServerContext, ServerSettings
from graft.serving.http.engine_worker import Job
from graft.serving.http.responses import (complete, error_response, sink, stream,
                                          watch_disconnect)

__all__ = ["ServerSettings", "build_app"]

_MAX_SHRINK_STEPS = 6  # downscale attempts before a budget refusal stands
_STATIC = Path(__file__).with_name("static")  # the chat page at / (package data)
# a refusal before the body was read: the rest of it must not be parsed as the next request
_CLOSE = {"Connection": "close"}


async def _read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The POST body within `timeout_s` (408 after), refusing (413) before buffering more than
    `limit` bytes."""
    try:
        return await asyncio.wait_for(_read_capped(request, limit), timeout_s)
    except asyncio.TimeoutError:
        raise P.APIError(f"the request body did not arrive within {timeout_s:g} s",
                         status=408, code="request_timeout", headers=_CLOSE) from None


async def _read_capped(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise P.APIError(f"request body is {declared} bytes, over the limit of {limit}",
                         status=413, code="request_too_large", headers=_CLOSE)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise P.APIError(f"request body is over the limit of {limit} bytes", status=413,
                             code="request_too_large", headers=_CLOSE)
        chunks.append(chunk)
    return b"".join(chunks)


def build_app(engine, settings: ServerSettings | None = None) -> FastAPI:
    """The FastAPI app around a loaded engine (`engine.mm` set for a run dir)."""
    ctx = ServerContext(engine, settings or ServerSettings())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await asyncio.to_thread(ctx.worker.warmup)
        ctx.worker.start()
        yield
        await asyncio.to_thread(ctx.worker.stop)

    app = FastAPI(title="graft", lifespan=lifespan)
    app.state.ctx = ctx
    keys = APIKeys(ctx.settings.api_keys)
    v1 = [Depends(keys.require)]  # every /v1 route; /health and /metrics when configured
    health_auth = v1 if ctx.settings.auth_health else []
    metrics_auth = v1 if ctx.settings.auth_metrics else []

    @app.exception_handler(P.APIError)
    async def _api_error(request: Request, err: P.APIError):
        if err.status == 429:
            ctx.metrics.rejected_429.inc()
        elif 400 <= err.status < 500:
            ctx.metrics.errors_4xx.inc()
        return error_response(err)

    @app.exception_handler(ClientDisconnect)
    async def _gone_while_sending(request: Request, err: ClientDisconnect):
        ctx.metrics.aborted.inc()  # hung up before its body arrived: nothing reached the engine
        return Response(status_code=499)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, err: Exception):
        # Starlette logs the traceback after this answer; the client gets no internals
        return error_response(P.APIError(
            "the server failed while handling this request; the server log has the details",
            status=500, type="server_error", code="internal_error"))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, err: StarletteHTTPException):
        ctx.metrics.errors_4xx.inc()
        kind = "not_found_error" if err.status_code == 404 else "invalid_request_error"
        # keep Starlette's headers: a 405 carries Allow
        return error_response(P.APIError(str(err.detail), status=err.status_code, type=kind,
                                         headers=dict(err.headers or {})))

    @app.get("/health", dependencies=health_auth)
    async def health():
        if not ctx.worker.alive:
            return JSONResponse({"status": "engine thread stopped"}, status_code=503)
        return {"status": "ok"}

    @app.get("/v1/models", dependencies=v1)
    async def models():
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0,
                                            "owned_by": "graft"} for name in ctx.models]}

    @app.get("/metrics", dependencies=metrics_auth)
    async def metrics():
        return PlainTextResponse(ctx.metrics.render(),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post(openapi_schema.CHAT_PATH, dependencies=v1)
    async def chat_completions(request: Request) -> Response:
        arrival = time.monotonic()
        ctx.metrics.requests.inc()
        ctx.worker.check_queue_room()  # a full queue refuses before any parsing or image work
        raw = await _read_body(request, ctx.max_body_bytes, ctx.settings.request_body_timeout_s)
        # big bodies (base64 images) are parsed off the event loop too
        req = (P.parse_chat_request(raw) if len(raw) < 65536
               else await asyncio.to_thread(P.parse_chat_request, raw))
        if req.model not in ctx.models:
            raise P.APIError(f"model {req.model!r} does not exist; this server serves "
                             f"{', '.join(map(repr, ctx.models))} (see /v1/models)", status=404,
                             type="not_found_error", param="model", code="model_not_found")
        front = ctx.models[req.model]  # the graft this request asked for
        ctx.metrics.grafts[req.model].requests.inc()
        ids, prepared, messages = await asyncio.to_thread(ctx.prepare, req, front)
        budget_ms = req.ttft_budget_ms or ctx.settings.default_ttft_budget_ms
        shrink = req.shrink_images_to_budget
        if shrink is None:
            shrink = ctx.settings.shrink_images_to_budget
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        cid = P.new_completion_id()
        for attempt in range(_MAX_SHRINK_STEPS + 1):
            job = Job(cid, ids, ctx.sampling_params(req, len(ids)), sink=sink(loop, queue),
                      prepared=prepared, arrival=arrival,
                      deadline=arrival + budget_ms / 1000 if budget_ms else None,
                      encode_tokens=front.uncached_tokens(prepared.images) if prepared else 0,
                      front=front, graft=req.model)
            try:
                ctx.worker.submit(job, budget_ms / 1000 if budget_ms else None)
                break
            except P.APIError as err:
                # Over budget: a native-resolution encoder can trade detail for tokens.
                if err.code != "ttft_budget_exceeded" or not shrink or not prepared \
                        or not prepared.images or attempt == _MAX_SHRINK_STEPS:
                    raise
                smaller = await asyncio.to_thread(ctx.shrink, messages, prepared, front)
                if smaller is None:
                    raise
                ids, prepared = smaller
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            watcher = watch_disconnect(request, lambda: ctx.worker.abort(job.request_id))
            return StreamingResponse(stream(ctx, job, queue, req.model, include_usage,
                                            req.top_logprobs or 0, watcher),
                                     media_type="text/event-stream")
        return await complete(ctx, job, queue, req.model, request, req.top_logprobs or 0)

    # the chat page (static files shipped in the package; it calls the API above)
    @app.get("/", include_in_schema=False)
    async def chat_page():
        return FileResponse(_STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=_STATIC), name="static")
    openapi_schema.install(app)
    return app
