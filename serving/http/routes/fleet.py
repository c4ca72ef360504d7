"""What routers ask of a worker beside the OpenAI API (serving/http/fleet/): vLLM's
/tokenize, /detokenize and render endpoints, SGLang's model, server and load info. Behind
the API key like /v1: a router holding the key sends it on every call."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import Response

from graft.serving.http.fleet import encoder_peers, server_info, tokenize
from graft.serving.http.openai import openai_chat as P
from graft.serving.http.openai.chat_request import _read_body

# vLLM's and SGLang's protocols, described by their code and docs/fleet.md, not by this
# server's OpenAPI document (which lists the OpenAI API)
router = APIRouter(include_in_schema=False)


async def _body(request: Request) -> bytes:
    ctx = request.app.state.ctx
    return await _read_body(request, ctx.max_body_bytes, ctx.settings.request_body_timeout_s)


@router.post("/tokenize")
async def tokenize_(request: Request):
    return await tokenize.tokenize(request.app.state.ctx, await _body(request))


@router.post("/detokenize")
async def detokenize(request: Request):
    return tokenize.detokenize(request.app.state.ctx, await _body(request))


@router.post("/v1/chat/completions/render")
async def render_chat(request: Request):
    return await tokenize.render_chat(request.app.state.ctx, await _body(request))


@router.post("/v1/completions/render")
async def render_completion(request: Request):
    return await tokenize.render_completion(request.app.state.ctx, await _body(request))


@router.post("/v1/responses/render")
async def render_responses(request: Request):
    return await tokenize.render_responses(request.app.state.ctx, await _body(request))


@router.get("/get_model_info")
@router.get("/model_info")
async def model_info(request: Request):
    return server_info.model_info(request.app.state.ctx)


@router.get("/get_server_info")
@router.get("/server_info")
async def get_server_info(request: Request):
    return server_info.server_info(request.app.state.ctx)


@router.get("/get_load")
async def get_load(request: Request):
    return server_info.get_load(request.app.state.ctx)


@router.get(encoder_peers.PATH)
async def encoder_cache_entry(key: str, request: Request):
    """Another worker of the fleet asks for an image's embeddings (fleet/encoder_peers.py)."""
    found = await asyncio.to_thread(encoder_peers.cached_rows,
                                    request.app.state.ctx.worker.cache, key)
    if found is None:
        raise P.APIError(f"image {key[:16]} is not in this worker's encoder cache", status=404,
                         type="not_found_error", code="not_cached")
    body, shape = found
    return Response(body, media_type="application/octet-stream",
                    headers={"x-graft-shape": shape})


@router.post("/reset_prefix_cache")
async def reset_prefix_cache(request: Request):
    """vLLM's: forget every cached KV block (KV-event subscribers get AllBlocksCleared); 409
    while a request runs or a prompt's KV waits for a decode worker."""
    engine = request.app.state.ctx.engine
    if not await request.app.state.ctx.worker.call(engine.block_manager.reset_prefix_cache):
        raise P.APIError("the prefix cache cannot be reset while requests hold KV blocks "
                         "(running, or held for a decode worker); retry when idle",
                         status=409, type="invalid_request_error", code="kv_in_use")
    return {"reset": True}
