"""graft_argv starts graft subcommands as the `graft` script does: the working directory is not
on the child's sys.path, so a directory holding something named like a module (a checkout, or
a stray `graft/`) cannot change what the child imports."""

import subprocess
import sys

import pytest

from graft.subprocess_argv import graft_argv


@pytest.mark.skipif(sys.version_info < (3, 11), reason="python -P is Python 3.11+")
def test_the_working_directory_is_not_imported_from(tmp_path):
    shadow = tmp_path / "graft"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise SystemExit('imported from the working directory')\n")
    plain = subprocess.run([sys.executable, "-m", "graft.cli", "--help"], cwd=tmp_path,
                           capture_output=True, text=True)
    assert "imported from the working directory" in plain.stderr  # what -P prevents
    run = subprocess.run(graft_argv("--help"), cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0 and "serve" in run.stdout
