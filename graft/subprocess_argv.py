"""The command line that runs a graft subcommand in a child process as the `graft` script runs it."""

from __future__ import annotations

import sys


def graft_argv(*args: str) -> list[str]:
    """[python, -P, -m, graft.cli, *args]: -P (Python 3.11+) keeps the working directory off
    sys.path, as the `graft` console script does. Started as `python -m graft.cli` from a graft
    checkout, `graft serve` ran the serve row's load with its TTFT p90 and p99 about 1.6x
    higher (p99 453-509 ms against 281-317, 2-core Xeon, 2026-12-06; the cause is not known),
    so the servers `graft bench peers` measures and `graft fleet` starts are started this way."""
    return [sys.executable, *(["-P"] if sys.version_info >= (3, 11) else []), "-m", "graft.cli", *args]
