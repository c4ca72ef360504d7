"""The OpenAI-compatible API: /v1/models and /v1/chat/completions (API key checked by the
dependency server.py attaches to this router)."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from graft.serving.http.chat_request import read_chat_request, submit_chat
from graft.serving.http.openapi_schema import CHAT_PATH
from graft.serving.http.responses import complete, stream, watch_disconnect

router = APIRouter()


@router.get("/v1/models")
async def models(request: Request):
    names = request.app.state.ctx.models
    return {"object": "list", "data": [{"id": name, "object": "model", "created": 0,
                                        "owned_by": "graft"} for name in names]}


@router.post(CHAT_PATH)
async def chat_completions(request: Request) -> Response:
    """Parse -> validate -> SamplingParams -> submit (chat_request.py), then answer."""
    arrival = time.monotonic()
    ctx = request.app.state.ctx
    req, front = await read_chat_request(ctx, request)
    job, queue = await submit_chat(ctx, req, front, arrival)
    top = req.top_logprobs or 0
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        watcher = watch_disconnect(request, lambda: ctx.worker.abort(job.request_id))
        return StreamingResponse(stream(ctx, job, queue, req.model, include_usage, top, watcher),
                                 media_type="text/event-stream")
    return await complete(ctx, job, queue, req.model, request, top)
