"""graft.io's writers and check_output_path: an output path graft cannot write is one
OutputPathError (a GraftConfigError, so the CLI prints one line) naming the path and the
problem; errors that are not about the output keep their own type."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

import pytest

from graft.errors import GraftConfigError
from graft.io import (OutputPathError, atomic_write, atomic_write_dir, atomic_write_json,
                      check_output_path)


@pytest.fixture
def layout(tmp_path):
    (tmp_path / "afile").write_text("mine")
    (tmp_path / "adir").mkdir()
    return tmp_path


def test_check_output_path_kinds(layout):
    with pytest.raises(OutputPathError, match=r"adir is a directory; give a file path"):
        check_output_path(layout / "adir", "file")
    with pytest.raises(OutputPathError, match=r"afile is a file, not a folder"):
        check_output_path(layout / "afile", "dir")
    with pytest.raises(OutputPathError, match=r"x/y: .*afile is a file, not a folder"):
        check_output_path(layout / "afile" / "x" / "y", "file")
    assert check_output_path(layout / "new" / "deeper" / "out.json") == layout / "new" / "deeper" / "out.json"
    assert check_output_path(layout / "adir", "dir") == layout / "adir"
    assert not (layout / "new").exists()  # a check creates nothing
    with pytest.raises(ValueError):
        check_output_path(layout / "x", "folder")


def test_check_output_path_and_writers_refuse_a_folder_without_write_permission(layout,
                                                                             monkeypatch):
    # root may write anywhere, so the OS is told to deny what a user without rights is denied
    ro = layout / "ro"
    ro.mkdir()
    real_access, real_mkstemp, real_mkdir = os.access, tempfile.mkstemp, Path.mkdir

    def denied(where):
        raise PermissionError(errno.EACCES, "Permission denied", str(where))

    monkeypatch.setattr(os, "access", lambda p, mode: Path(p) != ro and real_access(p, mode))
    monkeypatch.setattr(tempfile, "mkstemp", lambda prefix="", suffix="", dir=None: denied(
        Path(dir) / f"{prefix}x{suffix}") if Path(dir) == ro else real_mkstemp(suffix, prefix, dir))
    monkeypatch.setattr(Path, "mkdir", lambda self, *a, **k: denied(self) if self.parent == ro
                        else real_mkdir(self, *a, **k))
    for call in (lambda: check_output_path(ro / "a.json"), lambda: check_output_path(ro, "dir"),
                 lambda: check_output_path(ro / "sub" / "x", "dir"),
                 lambda: atomic_write_json(ro / "a.json", {}),
                 lambda: atomic_write_json(ro / "sub" / "a.json", {}),
                 lambda: atomic_write_dir(ro / "d", lambda d: None)):
        with pytest.raises(OutputPathError, match="not writable: permission denied"):
            call()


def test_writers_name_the_path_when_it_is_the_wrong_kind(layout):
    with pytest.raises(OutputPathError, match="adir is a directory") as info:
        atomic_write_json(layout / "adir", {"a": 1})
    assert isinstance(info.value, GraftConfigError) and isinstance(info.value, OSError)
    with pytest.raises(OutputPathError, match="afile is a file, not a folder"):
        atomic_write_json(layout / "afile" / "x.json", {})
    work = []
    with pytest.raises(OutputPathError, match="afile is a file, not a folder"):
        atomic_write_dir(layout / "afile", work.append)
    assert work == []  # refused before the (possibly long) work
    with pytest.raises(OutputPathError, match="afile is a file, not a folder"):
        atomic_write_dir(layout / "afile" / "sub", work.append)
    assert (layout / "afile").read_text() == "mine"
    assert sorted(p.name for p in layout.iterdir()) == ["adir", "afile"]  # no temp left


def test_a_full_disk_is_one_line_and_leaves_no_temp(layout):
    def full(tmp):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(OutputPathError, match=r"out.json could not be written: no space left") as info:
        atomic_write(layout / "out.json", full)
    assert info.value.errno == errno.ENOSPC  # callers that tell a full disk apart still can
    assert str(info.value).startswith("output ")  # not OSError's "[Errno 28] ..." form
    with pytest.raises(OutputPathError, match=r"outdir could not be written: no space left"):
        atomic_write_dir(layout / "outdir", full)
    assert sorted(p.name for p in layout.iterdir()) == ["adir", "afile"]


def test_errors_about_inputs_keep_their_type(layout):
    def reads_a_missing_input(tmp):
        open(layout / "adir" / "missing.bin", "rb")

    def input_denied(tmp):
        raise PermissionError(errno.EACCES, "Permission denied", str(layout / "input.bin"))

    with pytest.raises(FileNotFoundError):
        atomic_write(layout / "out.bin", reads_a_missing_input)
    with pytest.raises(PermissionError) as info:
        atomic_write_dir(layout / "outdir", input_denied)
    assert not isinstance(info.value, OutputPathError)


def test_written_files_get_a_plain_open_s_permissions(tmp_path):
    """Not mkstemp's 0600: a result another user (or a container's other uid) must read."""
    old = os.umask(0o022)
    try:
        fresh = tmp_path / "fresh.json"
        atomic_write_json(fresh, {"a": 1})
        assert fresh.stat().st_mode & 0o777 == 0o644
        os.umask(0o027)
        other = tmp_path / "other.json"
        atomic_write_json(other, {"a": 1})
        assert other.stat().st_mode & 0o777 == 0o640
        fresh.chmod(0o664)  # a replaced file keeps the mode its owner gave it
        atomic_write_json(fresh, {"a": 2})
        assert fresh.stat().st_mode & 0o777 == 0o664
    finally:
        os.umask(old)
