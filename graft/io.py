"""Atomic file and dir writes (temp, then rename: nothing half-written is ever trusted), YAML reading.

The digests that used to live here are in graft.digests (re-exported)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Callable

from graft.digests import sha256_file, weights_sha256  # noqa: F401 - re-exported (old home)


def atomic_write(path: str | Path, write: Callable[[Path], None], suffix: str = ".tmp") -> Path:
    """`write(tmp)` fills a temp file beside `path`, then it is renamed onto `path`: readers
    see the old file or the complete new one, never half. `suffix`: the temp file's ending
    (a writer that picks its format from the name needs the real one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())

    atomic_write(path, write)


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


def atomic_write_dir(path: str | Path, write: Callable[[Path], None],
                     prefix: str | None = None) -> Path:
    """`write(tmp)` fills a fresh sibling dir, which then takes the place of `path` (an old
    `path` is moved aside first and removed after): no half-written dir is ever at `path`.
    `prefix`: the temp dirs' name start (default `.<name>.`), for callers that sweep leftovers."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f"{prefix or f'.{path.name}.'}{uuid.uuid4().hex[:12]}"
    tmp.mkdir()
    try:
        write(tmp)
        if path.exists():
            old = tmp.with_name(tmp.name + ".old")
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def check_writable_dir(path: Path, what: str, fix: str) -> None:
    """GraftConfigError "{what} {path} is not writable (why); {fix}" unless a file can be
    created in `path` (made, with its parents, if missing)."""
    from graft.errors import GraftConfigError

    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".graft-write-probe.", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise GraftConfigError(f"{what} {path} is not writable ({err.strerror or err}); "
                               f"{fix}") from None


def read_yaml(path: str | Path, what: str = "config file"):
    """Parse a YAML file, or raise GraftConfigError naming the file, the line and what is wrong."""
    from graft.errors import GraftConfigError
    from graft.loads import yaml_loads

    path = Path(path)
    if not path.is_file():
        raise GraftConfigError(f"{what} {path} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise GraftConfigError(f"{what} {path}: cannot read it ({err})") from None
    return yaml_loads(text, str(path))
