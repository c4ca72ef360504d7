"""`make browser` (run by `make test`): finds Chromium by the names the chat-page tests look
for, and never fails when it cannot install one (the browser tests then skip)."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.serving.http.cdp import CHROMIUM_NAMES

ROOT = Path(__file__).resolve().parents[1]


def _make_browser(path_dirs: list[Path]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": os.pathsep.join(map(str, path_dirs))}
    return subprocess.run([shutil.which("make"), "-s", "-C", str(ROOT), "browser"], env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def tools(tmp_path):
    """A PATH holding only what the recipe needs besides a browser or apt-get."""
    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "id"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    return bin_dir


def _script(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def test_names_match_the_tests():
    names = re.search(r"^CHROMIUM_NAMES := (.+)$", (ROOT / "Makefile").read_text(), re.M)
    assert tuple(names.group(1).split()) == CHROMIUM_NAMES


def test_finds_a_browser_by_any_name(tools, tmp_path):
    fake = _script(tmp_path / "browsers", "chromium-browser", "exit 0")
    done = _make_browser([tools, fake.parent])
    assert done.returncode == 0 and done.stdout.strip() == f"browser: {fake}"


def test_no_browser_and_no_apt_is_not_a_failure(tools):
    done = _make_browser([tools])
    assert done.returncode == 0
    assert "no Chromium and no root apt-get; the Chromium chat-page tests will skip" in done.stdout


def test_a_failed_install_is_not_a_failure(tools, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the apt-get branch runs only as root")
    _script(tmp_path / "apt", "apt-get", "echo 'E: Unable to locate package chromium' >&2; exit 100")
    done = _make_browser([tools, tmp_path / "apt"])
    assert done.returncode == 0
    assert "apt-get install chromium failed; the Chromium chat-page tests will skip" in done.stdout
