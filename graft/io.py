"""Atomic file writes and weight digests: nothing half-written is ever trusted."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def atomic_torch_save(obj, path: str | Path) -> None:
    import io

    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    atomic_write_bytes(path, buf.getvalue())


def sha256_file(path: str | Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


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


def read_yaml(path: str | Path, what: str = "config file"):
    """Parse a YAML file, or raise GraftConfigError naming the file and what is wrong."""
    import yaml

    from graft.errors import GraftConfigError

    path = Path(path)
    if not path.is_file():
        raise GraftConfigError(f"{what} {path} does not exist")
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise GraftConfigError(f"{path}: not valid YAML: {err}") from None
