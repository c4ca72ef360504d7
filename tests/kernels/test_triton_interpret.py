"""Collects tests/kernels/triton_cases.py: in this process while Triton can still be put in
interpreter mode, else (triton already imported by another test) in a fresh process.

TRITON_INTERPRET=0 runs the same cases on a GPU.
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

if os.environ.get("TRITON_INTERPRET") == "0" or "triton" not in sys.modules:
    from tests.kernels.triton_cases import *  # noqa: F401,F403  (sets TRITON_INTERPRET first)
else:

    def test_triton_cases_in_fresh_interpreter_process():
        cases = Path(__file__).with_name("triton_cases.py")
        env = dict(os.environ, TRITON_INTERPRET="1")
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(cases)],
                              env=env, capture_output=True, text=True, timeout=600,
                              cwd=Path(__file__).resolve().parents[2])
        assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
