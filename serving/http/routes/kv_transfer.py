"""GET /v1/graft/kv_transfer/{request_id}: a prefill worker hands a decode worker the prompt's
KV it holds (graft's connector, serving/http/fleet/pd.py), once; the blocks are freed as it
is read. GET .../meta: what is held (tokens, images, blocks, layout) and the NIXL handshake,
for a decode worker that reads the blocks over NIXL instead. Behind the API key like every
/v1 route."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import Response

from graft.serving.engine.kv_transfer import encode_payload
from graft.serving.http.fleet.pd import META_PATH, PULL_PATH, export_meta
from graft.serving.http.openai import openai_chat as P

router = APIRouter(include_in_schema=False)  # graft-to-graft protocol (binary body), not API


@router.get(META_PATH)
async def kv_transfer_meta(request_id: str, request: Request):
    ctx = _producer(request)
    meta = export_meta(ctx, request_id)
    if meta is None:
        raise _not_held(request_id)
    return meta


@router.get(PULL_PATH)
async def kv_transfer(request_id: str, request: Request):
    ctx = _producer(request)
    engine = ctx.engine
    payload = await ctx.worker.call(lambda: engine.kv_exports.take(engine.runner, request_id))
    if payload is None:
        raise _not_held(request_id)
    body = await asyncio.to_thread(encode_payload, payload)
    return Response(body, media_type="application/octet-stream")


def _producer(request: Request):
    ctx = request.app.state.ctx
    if ctx.kv_transfer is None or not ctx.kv_transfer.produces:
        raise P.APIError("this worker holds no KV for other workers (start it with "
                         "--kv-transfer-config and kv_role kv_producer or kv_both)",
                         status=404, type="not_found_error", code="kv_transfer_disabled")
    return ctx


def _not_held(request_id: str) -> P.APIError:
    return P.APIError(f"no KV is held for request {request_id!r}: it was read already, "
                      "expired, or never finished its prefill", status=404,
                      type="not_found_error", code="kv_not_found")
