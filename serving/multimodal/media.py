"""Turn an `image_url` into decoded RGB pixels plus a content hash, within limits.

Sources: base64 `data:` URLs always; local files only under an allowed root; http(s) only
when remote media is allowed. Blocking work (I/O, decode, hashing): call from a thread.
"""

from __future__ import annotations

import base64
import binascii
import io
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from PIL import Image

from graft.digests import pixel_hash  # noqa: F401 - re-exported: callers import it from here
from graft.errors import RequestError


@dataclass
class MediaConfig:
    allowed_local_media_path: str | None = None  # root that local paths/file:// must lie under
    allow_remote_media: bool = False  # fetch http(s) URLs (off: a server should not browse)
    max_image_bytes: int = 20 * 1024 * 1024  # encoded size limit per image
    max_image_pixels: int = 4096 * 4096  # width * height limit, checked before decoding
    remote_timeout_s: float = 10.0  # all of a request's remote fetches, queue wait included
    remote_max_redirects: int = 3  # each redirect target is checked like the first URL
    remote_domains: tuple[str, ...] = ()  # allowed hosts (and their subdomains); empty: any


@dataclass
class LoadedImage:
    image: Image.Image  # RGB, fully decoded
    content_hash: str  # sha256 over size + RGB pixels: same picture, same hash, any encoding
    width: int
    height: int


def _too_big(n: int, cfg: MediaConfig, param: str) -> RequestError:
    return RequestError(f"image is {n} bytes, over the limit of {cfg.max_image_bytes} bytes; "
                        "send a smaller image", param=param, code="image_too_large",
                        reason="too_large")


def _data_url_bytes(url: str, cfg: MediaConfig, param: str) -> bytes:
    head, sep, payload = url.partition(",")
    head = head.lower()  # scheme, media type and ";base64" are case-insensitive (RFC 2397)
    if not sep or ";base64" not in head:
        raise RequestError("data URL must look like data:image/<type>;base64,<payload>",
                           param=param, code="invalid_image_url")
    if not head[5:].startswith("image/"):
        raise RequestError(f"data URL media type must be image/*, got {head[5:].split(';')[0]!r}",
                           param=param, code="invalid_image_url")
    # base64 inflates by 4/3: refuse before decoding a payload that cannot fit
    if len(payload) * 3 // 4 > cfg.max_image_bytes + 3:
        raise _too_big(len(payload) * 3 // 4, cfg, param)
    try:
        return base64.b64decode("".join(payload.split()), validate=True)
    except (binascii.Error, ValueError) as err:
        raise RequestError(f"image data URL has invalid base64: {err}", param=param,
                           code="invalid_base64") from None


def _local_bytes(url: str, cfg: MediaConfig, param: str) -> bytes:
    if cfg.allowed_local_media_path is None:
        raise RequestError("local image paths are disabled; start the server with "
                           "--allowed-local-media-path DIR or send a base64 data URL",
                           param=param, code="local_media_disabled", reason="forbidden")
    raw = unquote(urlparse(url).path) if url[:7].lower() == "file://" else url
    root = Path(cfg.allowed_local_media_path).resolve()
    path = Path(raw).resolve()  # resolves symlinks and "..": containment is checked after
    if path != root and root not in path.parents:
        raise RequestError(f"image path {raw!r} is outside --allowed-local-media-path",
                           param=param, code="local_media_forbidden", reason="forbidden")
    if not path.is_file():
        raise RequestError(f"image file {raw!r} does not exist", param=param,
                           code="image_not_found")
    size = path.stat().st_size
    if size > cfg.max_image_bytes:
        raise _too_big(size, cfg, param)
    return path.read_bytes()


def _remote_bytes(url: str, cfg: MediaConfig, param: str) -> bytes:
    if not cfg.allow_remote_media:
        raise RequestError("remote image URLs are disabled; start the server with "
                           "--allow-remote-media or send a base64 data URL",
                           param=param, code="remote_media_disabled", reason="forbidden")
    from graft.serving.multimodal.remote_media import fetch_remote

    return fetch_remote(url, cfg.max_image_bytes, cfg.remote_timeout_s,
                        cfg.remote_max_redirects, cfg.remote_domains, param)


def is_remote(url: str) -> bool:
    """An http(s) URL (fetched on the remote pool, within the request's deadline)."""
    return url.partition(":")[0].lower() in ("http", "https")


def fetch_bytes(url: str, cfg: MediaConfig, param: str = "image_url.url") -> bytes:
    """Encoded image bytes from any allowed source (size-limited)."""
    scheme = url.partition(":")[0].lower()  # URL schemes are case-insensitive: DATA: too
    if scheme == "data":
        data = _data_url_bytes(url, cfg, param)
    elif is_remote(url):
        data = _remote_bytes(url, cfg, param)
    elif scheme == "file" or "://" not in url:
        data = _local_bytes(url, cfg, param)
    else:
        raise RequestError(f"unsupported image URL scheme in {url[:32]!r}; use data:, file:// "
                           "or http(s)://", param=param, code="invalid_image_url")
    if len(data) > cfg.max_image_bytes:
        raise _too_big(len(data), cfg, param)
    return data


def decode_image(data: bytes, cfg: MediaConfig, param: str = "image_url.url") -> LoadedImage:
    """Bytes -> RGB pixels + hash; the pixel limit is checked from the header, before decoding."""
    try:
        img = Image.open(io.BytesIO(data))
        width, height = img.size
    except Image.DecompressionBombError:  # PIL's own limit, far above ours: still "too big"
        raise RequestError(f"image is over the limit of {cfg.max_image_pixels} pixels; resize it",
                           param=param, code="image_too_large", reason="too_large") from None
    except Exception:  # PIL raises many types for garbage; all mean "not an image"
        raise RequestError("image bytes could not be decoded as an image (PNG, JPEG, WebP, ...)",
                           param=param, code="invalid_image") from None
    if width * height > cfg.max_image_pixels:
        raise RequestError(f"image is {width}x{height} = {width * height} pixels, over the limit "
                           f"of {cfg.max_image_pixels}; resize it", param=param,
                           code="image_too_large", reason="too_large")
    try:
        img.load()
        rgb = img.convert("RGB")
    except Exception:
        raise RequestError("image data is truncated or corrupt", param=param,
                           code="invalid_image") from None
    return LoadedImage(rgb, pixel_hash(rgb), width, height)


def load_image(url: str, cfg: MediaConfig, param: str = "image_url.url") -> LoadedImage:
    return decode_image(fetch_bytes(url, cfg, param), cfg, param)


def to_data_url(image: Image.Image, fmt: str = "PNG") -> str:
    """Encode a PIL image as a base64 data URL (clients, tests and the load generator)."""
    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode()

