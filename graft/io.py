"""Atomic file and dir writes (temp, then rename: nothing half-written is ever trusted), YAML reading.

The digests that used to live here are in graft.digests (re-exported)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Callable

from graft.digests import sha256_file, weights_sha256  # noqa: F401 - re-exported (old home)
from graft.errors import GraftConfigError


class OutputPathError(GraftConfigError, OSError):
    """An output path graft cannot write: the message names it and the problem. Also an
    OSError carrying the original errno/strerror/filename, so code that catches the raw
    OSError of a failed write (graft train's full-disk message) still recognizes it."""

    def __init__(self, message: str, cause: OSError | None = None):
        super().__init__(message)
        if cause is not None:
            self.errno, self.strerror, self.filename = cause.errno, cause.strerror, cause.filename

    def __str__(self) -> str:  # the message, not OSError's "[Errno N] ..." form
        return self.args[0]


# errnos that say "this output cannot be written here" (not a bug): each gets one line
_WRITE_PROBLEMS = {
    errno.EISDIR: "is a directory; give a file path",
    errno.EACCES: "is not writable: permission denied; pick a folder you can write",
    errno.EPERM: "is not writable: operation not permitted; pick a folder you can write",
    errno.EROFS: "is on a read-only file system; pick a writable folder",
    errno.ENOSPC: "could not be written: no space left on the device; free space or pick "
                  "another disk",
    errno.EDQUOT: "could not be written: disk quota exceeded; free space or pick another disk",
}
_NOT_A_FOLDER = (errno.ENOTDIR, errno.EEXIST)  # a file where a folder is needed


def _output_error(path: Path, err: OSError) -> OSError:
    """The one-line OutputPathError for a failed write of `path`, or `err` itself when it is
    not a path problem (a bug or an input error must keep its traceback)."""
    if err.errno in _NOT_A_FOLDER:
        where = Path(err.filename) if err.filename else path
        if where == path:
            return OutputPathError(f"output {path} is a file, not a folder; give a folder path",
                                   err)
        return OutputPathError(f"output {path}: {where} is a file, not a folder; give a path "
                               "under a folder", err)
    problem = _WRITE_PROBLEMS.get(err.errno)
    return err if problem is None else OutputPathError(f"output {path} {problem}", err)


def _refuse(path: Path, code: int, where: Path | None = None) -> OutputPathError:
    return _output_error(path, OSError(code, os.strerror(code), str(where or path)))


@contextlib.contextmanager
def _writing(path: Path, tmp: Path):
    """OSErrors raised for `path`, its temp sibling `tmp` (or inside it), a folder on the way,
    or with no file name (a full disk mid-write) become OutputPathError; others (reading an
    input, a bug) pass unchanged."""
    try:
        yield
    except OutputPathError:
        raise
    except OSError as err:
        name = Path(err.filename) if err.filename else None
        ours = (name is None or name in (path, tmp) or tmp in name.parents
                or name in path.parents or _is_temp_of(path, name))
        new = _output_error(path, err) if ours else err
        if new is err:
            raise
        raise new from None


def _is_temp_of(path: Path, name: Path) -> bool:
    """`name` is one of `path`'s default temp siblings (.<name>.<random>)."""
    return name.parent == path.parent and name.name.startswith(f".{path.name}.")


def check_output_path(path: str | Path, kind: str = "file") -> Path:
    """Raise OutputPathError (one line naming `path` and the fix) unless `path` can be written
    as a `kind` ("file" or "dir"): a file path must not be an existing folder, a dir path not
    an existing file, no part of the way there may be a file, and the nearest existing folder
    on the way (or the dir itself) must take a new file from this process (tried with a temp
    file, removed at once: permissions do not stop root, a read-only mount or /sys do). Leaves
    nothing behind; call it before long work so a bad --out fails in a second, not after the
    work. Whether the dir is empty, or an existing file may be replaced, is the caller's rule
    (--force/--overwrite)."""
    if kind not in ("file", "dir"):
        raise ValueError(f"kind={kind!r}: use 'file' or 'dir'")
    path = Path(path)
    if path.is_dir() and kind == "file":
        raise _refuse(path, errno.EISDIR)
    if path.exists() and not path.is_dir() and kind == "dir":
        raise _refuse(path, errno.ENOTDIR)
    probe = path if path.is_dir() else path.parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise _refuse(path, errno.ENOTDIR, probe)
    try:
        fd, tmp = tempfile.mkstemp(prefix=".graft-write-probe.", dir=probe)
        os.close(fd)
        os.unlink(tmp)
    except OSError as err:
        raise _refuse(path, err.errno if err.errno in _WRITE_PROBLEMS else errno.EACCES) from None
    return path


def atomic_write(path: str | Path, write: Callable[[Path], None], suffix: str = ".tmp") -> Path:
    """`write(tmp)` fills a temp file beside `path`, then it is renamed onto `path`: readers
    see the old file or the complete new one, never half. `suffix`: the temp file's ending
    (a writer that picks its format from the name needs the real one). A path that cannot be
    written (a folder, under a file, no permission, disk full) is one OutputPathError."""
    path = Path(path)
    with _writing(path, path):
        if path.is_dir():  # os.replace would say EISDIR only after all the work
            raise _refuse(path, errno.EISDIR)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.close(fd)
    try:
        with _writing(path, Path(tmp)):
            write(Path(tmp))
            os.chmod(tmp, _mode_for(path))  # mkstemp's 0600 would hide it from everyone else
            os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _mode_for(path: Path) -> int:
    """The permissions a plain open() would give `path`: the replaced file's, else 0666 less
    the umask (read from /proc, since os.umask can only be read by setting it)."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        pass
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o644


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
    tmp = path.parent / f"{prefix or f'.{path.name}.'}{uuid.uuid4().hex[:12]}"
    with _writing(path, tmp):
        if path.exists() and not path.is_dir():  # checked first: the work may take minutes
            raise _refuse(path, errno.ENOTDIR)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
    try:
        with _writing(path, tmp):
            _fill_and_swap(path, tmp, write)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def _fill_and_swap(path: Path, tmp: Path, write: Callable[[Path], None]) -> None:
    write(tmp)
    if path.exists():
        old = tmp.with_name(tmp.name + ".old")
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, path)


def check_writable_dir(path: Path, what: str, fix: str) -> None:
    """GraftConfigError "{what} {path} is not writable (why); {fix}" unless a file can be
    created in `path` (made, with its parents, if missing)."""
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
    from graft.loads import yaml_loads

    path = Path(path)
    if not path.is_file():
        raise GraftConfigError(f"{what} {path} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise GraftConfigError(f"{what} {path}: cannot read it ({err})") from None
    return yaml_loads(text, str(path))
