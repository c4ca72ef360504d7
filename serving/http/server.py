"""OpenAI-compatible HTTP server: parses, validates and streams; the engine runs elsewhere.

One background thread (EngineWorker) steps the engine; each request reads its outputs from
its own asyncio queue. Image fetching, decoding, hashing and tokenizing run off the loop.
`build_app` wires the parts: the context, the error handlers, and the routers of
serving/http/routes (a request's path to the engine is serving/http/openai/chat_request.py).
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from graft.serving.http.openai import openai_chat as P
from graft.serving.http.openai import openapi_schema
from graft.serving.http.plumbing.auth import APIKeys
from graft.serving.http.context import ServerContext, ServerSettings
from graft.serving.http.plumbing.request_guard import RequestGuard
from graft.serving.http.openai.responses import error_response
from graft.serving.http.routes import fleet, kv_transfer, ops, page, v1

__all__ = ["ServerSettings", "build_app"]


def build_app(engine, settings: ServerSettings | None = None) -> FastAPI:
    """The FastAPI app around a loaded engine (`engine.mm` set for a run dir)."""
    ctx = ServerContext(engine, settings or ServerSettings())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await asyncio.to_thread(ctx.worker.warmup)
        ctx.worker.start()
        yield
        await asyncio.to_thread(ctx.worker.stop)
        ctx.media_pool.shutdown(wait=False, cancel_futures=True)
        ctx.remote_media_pool.shutdown(wait=False, cancel_futures=True)

    # the docs and the schema are routes of openapi_schema, behind the key when one is set
    app = FastAPI(title="graft", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.ctx = ctx
    _install_error_handlers(app, ctx)
    app.add_middleware(RequestGuard, allowed_hosts=ctx.settings.allowed_hosts,
                       on_refused=ctx.metrics.errors_4xx.inc,
                       max_header_bytes=ctx.settings.max_header_bytes)
    keyed = [Depends(APIKeys(ctx.settings.api_keys).require)]
    app.include_router(ops.health_router, dependencies=keyed if ctx.settings.auth_health else [])
    app.include_router(v1.router, dependencies=keyed)  # every /v1 route
    app.include_router(kv_transfer.router, dependencies=keyed)
    app.include_router(fleet.router, dependencies=keyed)  # what routers ask (docs/fleet.md)
    app.include_router(ops.metrics_router,
                       dependencies=keyed if ctx.settings.auth_metrics else [])
    app.include_router(page.router)
    page.mount_static(app)
    openapi_schema.install(app, keyed)
    return app


def _install_error_handlers(app: FastAPI, ctx: ServerContext) -> None:
    """Every refusal in OpenAI's error shape, counted in the metrics."""

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
        message, code = _routing_message(request, err)
        # keep Starlette's headers: a 405 carries Allow
        return error_response(P.APIError(message, status=err.status_code, type=kind, code=code,
                                         headers=dict(err.headers or {})))


def _routing_message(request: Request, err: StarletteHTTPException) -> tuple[str, str | None]:
    """Starlette's bare "Not Found" / "Method Not Allowed" say neither what was asked nor
    what to do; name the method and path, and the fix (OpenAI's own 404 names them too)."""
    asked = f"{request.method} {request.url.path}"
    if err.status_code == 404:
        return (f"no route {asked}; check the path (e.g. /v1/chat/completions; "
                "/openapi.json lists the routes)", "route_not_found")
    if err.status_code == 405:
        allowed = (err.headers or {}).get("Allow", "")
        return f"{asked} is not allowed; use {allowed or 'another method'}", "method_not_allowed"
    return str(err.detail), None
