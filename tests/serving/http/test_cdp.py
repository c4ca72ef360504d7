"""The browser-test helper itself: Chromium gets its DevTools pipe on fds 3 and 4 wherever
os.pipe() put the pipes, also when they already sit on 3 and 4 (a dup2 onto the same descriptor
would leave it close-on-exec, and Chromium would find no pipe)."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.serving.http.cdp import NO_CHROMIUM, find_chromium

REPO = Path(__file__).resolve().parents[3]
# a fresh interpreter with fds 3 and 4 free, so that the first pipe lands on exactly them
SCRIPT = """
import os
os.closerange(3, 5)
pipes, real_pipe = [], os.pipe
os.pipe = lambda: pipes.append(real_pipe()) or pipes[-1]
from tests.serving.http.cdp import Browser
browser = Browser(320, 240)
try:
    print(pipes[0], browser.js("6 * 7"))
finally:
    browser.close()
"""


def test_chromium_starts_with_its_pipes_already_on_fds_3_and_4():
    if find_chromium() is None:
        pytest.skip(NO_CHROMIUM)
    run = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split("\n")[0] == "(3, 4) 42"
