"""GET /v1/graft/kv_transfer/{request_id}: a prefill worker hands a decode worker the prompt's
KV it holds (graft's connector, serving/http/fleet/pd.py), once; the blocks are freed as it
is read. Behind the API key like every /v1 route."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import Response

from graft.serving.engine.kv_transfer import encode_payload
from graft.serving.http.fleet.pd import PULL_PATH
from graft.serving.http.openai import openai_chat as P

router = APIRouter()


@router.get(PULL_PATH)
async def kv_transfer(request_id: str, request: Request):
    ctx = request.app.state.ctx
    if ctx.kv_transfer is None or not ctx.kv_transfer.produces:
        raise P.APIError("this worker holds no KV for other workers (start it with "
                         "--kv-transfer-config and kv_role kv_producer or kv_both)",
                         status=404, type="not_found_error", code="kv_transfer_disabled")
    engine = ctx.engine
    payload = await ctx.worker.call(lambda: engine.kv_exports.take(engine.runner, request_id))
    if payload is None:
        raise P.APIError(f"no KV is held for request {request_id!r}: it was read already, "
                         "expired, or never finished its prefill", status=404,
                         type="not_found_error", code="kv_not_found")
    body = await asyncio.to_thread(encode_payload, payload)
    return Response(body, media_type="application/octet-stream")
