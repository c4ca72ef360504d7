"""The chat page at / (static files shipped in the package; the page calls the /v1 API)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).resolve().parents[1] / "static"

router = APIRouter()

# The page runs only its own scripts and styles, shows pasted images (data:/blob: URLs), talks
# only to this server, and may not be framed (clickjacking a send button)
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data: blob:; "
                               "object-src 'none'; base-uri 'none'; form-action 'self'; "
                               "frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


@router.get("/", include_in_schema=False)
async def chat_page():
    return FileResponse(STATIC / "index.html", headers=PAGE_HEADERS)


def mount_static(app: FastAPI) -> None:
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
