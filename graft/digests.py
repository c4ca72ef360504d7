"""sha256 digests: of a file, of an HF model dir's weights, of an image's decoded pixels.

A leaf module (stdlib only; GraftConfigError loaded on demand) so every subpackage may use it.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

# (abs path, size, mtime_ns) -> sha256: hashing a multi-GB checkpoint once per process is enough.
_SHA_CACHE: dict[tuple[str, int, int], str] = {}


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22, *, cached: bool = False) -> str:
    """Hex sha256 of a file's bytes. `cached`: remembered per (path, size, mtime) in this process."""
    if not cached:
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            while block := fh.read(chunk):
                h.update(block)
        return h.hexdigest()
    p = Path(path).resolve()
    st = p.stat()
    key = (str(p), st.st_size, st.st_mtime_ns)
    if key not in _SHA_CACHE:
        _SHA_CACHE[key] = sha256_file(p, chunk)
    return _SHA_CACHE[key]


def weights_sha256(model_dir: str | Path) -> str:
    """One digest over every weight file of an HF model dir (name + content, sorted)."""
    model_dir = Path(model_dir)
    files = sorted(p for p in model_dir.iterdir()
                   if p.suffix in (".safetensors", ".bin", ".gguf") and p.is_file())
    if not files:
        from graft.errors import GraftConfigError

        raise GraftConfigError(f"llm.path {model_dir}: no weight files (*.safetensors/*.bin)")
    h = hashlib.sha256()
    for p in files:
        h.update(p.name.encode())
        h.update(sha256_file(p).encode())
    return h.hexdigest()


def pixel_hash(image) -> str:
    """sha256 over the size and RGB pixels of a PIL image: same picture, same hash, any encoding."""
    rgb = image if image.mode == "RGB" else image.convert("RGB")
    h = hashlib.sha256(f"RGB:{rgb.width}x{rgb.height}:".encode())
    h.update(rgb.tobytes())
    return h.hexdigest()
