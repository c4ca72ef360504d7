"""The routers from PyPI (vllm-router, sglang-router) as real processes in front of live graft
workers; found in the venvs `make router-venvs` builds, else on PATH. Tests that use them skip,
saying why, when they are absent."""

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[3]


def vllm_router() -> str:
    """Path of the vllm-router binary, or skip the test."""
    for candidate in (os.environ.get("GRAFT_VLLM_ROUTER"), ROOT / ".venv-router/bin/vllm-router",
                      shutil.which("vllm-router")):
        if candidate and Path(candidate).is_file():
            return str(candidate)
    pytest.skip("vllm-router is not installed (make router-venvs, or set GRAFT_VLLM_ROUTER)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Router:
    """A router process on a free port, its log in `log_path`; stopped on exit."""

    def __init__(self, argv: list[str], log_path: Path, ready_path: str = "/health"):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = [*argv, "--host", "127.0.0.1", "--port", str(self.port)]
        self.log_path = log_path
        self.ready_path = ready_path

    def __enter__(self):
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(600):  # until it answers (no timing assertion)
            if self.proc.poll() is not None:
                raise RuntimeError(f"router exited {self.proc.returncode}: {self.text()[-2000:]}")
            try:
                if httpx.get(self.url + self.ready_path, timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"router did not start: {self.text()[-2000:]}")

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")
