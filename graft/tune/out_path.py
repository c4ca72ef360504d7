"""The --out file of `graft tune` and `graft tune synth`, checked before any work: a folder, a
path that cannot be written, or an existing file without --force is one line, not an error
after minutes of replays (or a user's file silently replaced)."""

from __future__ import annotations

from pathlib import Path

from graft.errors import GraftConfigError


def check_out_file(path: str | Path, force: bool, example: str) -> Path:
    """`path` as a Path, or GraftConfigError naming --out and the fix; `example`: a file name
    to suggest when `path` is a folder."""
    from graft.io import OutputPathError, check_output_path

    path = Path(path)
    if path.is_dir():
        raise GraftConfigError(f"--out {path} is a folder; name a file, e.g. --out {path / example}")
    if path.exists() and not force:
        raise GraftConfigError(f"--out {path} exists; pass --force to overwrite it or choose "
                               "another name")
    try:
        return check_output_path(path, "file")
    except OutputPathError as err:
        raise GraftConfigError(f"--out: {err}") from None
