"""How many CPU threads torch should use when nobody said: on a machine whose cores other work
already keeps busy, torch's default (one thread per core) oversubscribes them and a training
step can run ten times slower than with fewer threads. An explicit OMP_NUM_THREADS always wins."""

from __future__ import annotations

import json
import os
import sys


def choose_threads(cpus: int, load: float, env) -> tuple[int | None, str]:
    """(threads to use, or None to leave torch's default; the one-line reason). `cpus` is
    what this process may run on, `load` the 1-minute load average (runnable processes)."""
    if env.get("OMP_NUM_THREADS"):
        return None, ""
    free = int(cpus - load + 0.5)  # cores no one else is running on, rounded
    if free >= cpus:
        return None, ""
    threads = max(1, min(free, cpus))
    return threads, (f"graft: {cpus} CPU cores, load {load:.1f} from other work: using {threads} "
                     f"torch thread{'s' if threads > 1 else ''} (set OMP_NUM_THREADS to choose)")


def apply_thread_choice(env=None, out=None, log_format: str = "text") -> int | None:
    """Choose once per process (the environment carries the choice to child processes) and
    say so on stderr (as one JSON log object when the command logs JSON, like `graft serve
    --log-format json`); returns the thread count set, or None."""
    env = os.environ if env is None else env
    try:
        cpus, load = len(os.sched_getaffinity(0)), os.getloadavg()[0]
    except (AttributeError, OSError):  # no affinity / load average on this OS: leave it
        return None
    threads, why = choose_threads(cpus, load, env)
    if threads is None:
        return None
    env["OMP_NUM_THREADS"] = str(threads)
    if "torch" in sys.modules:  # already loaded: its pool size is set directly
        sys.modules["torch"].set_num_threads(threads)
    if log_format == "json":
        from datetime import datetime, timezone

        why = json.dumps({"time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
                          "level": "INFO", "logger": "graft.threads", "message": why})
    print(why, file=out or sys.stderr)
    return threads
