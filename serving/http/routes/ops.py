"""What operators poll: /health and vLLM's /ping (503 once the engine thread stopped),
/version (as vLLM's) and Prometheus /metrics. Two routers, so server.py can put an API key on
either alone (--auth-health, --auth-metrics)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse

health_router = APIRouter()
metrics_router = APIRouter()


@health_router.get("/health")
@health_router.get("/ping")  # vLLM's, what SageMaker polls
async def health(request: Request):
    if not request.app.state.ctx.worker.alive:
        return JSONResponse({"status": "engine thread stopped"}, status_code=503)
    return {"status": "ok"}


@health_router.get("/version")
async def version():
    from graft import __version__

    return {"version": __version__}


@metrics_router.get("/metrics")
async def metrics(request: Request):
    return PlainTextResponse(request.app.state.ctx.metrics.render(),
                             media_type="text/plain; version=0.0.4; charset=utf-8")
