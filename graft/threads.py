"""How many CPU threads torch should use when nobody said: on a machine whose cores other work
keeps busy, torch's default (one thread per core) oversubscribes them and a training step can
run ten times slower than with fewer threads. An explicit OMP_NUM_THREADS always wins.

The decision looks at what runs now: the CPUs' busy time over a fraction of a second from
/proc/stat, less this process's own. The load average is not used: it still counts work that
ended minutes ago, so an idle machine right after a benchmark (or `pip install`) looked busy.
Long jobs call `ThreadRecheck.tick()` between steps, which looks again now and then, so a job
that started beside other work speeds up once that work ends.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass

# beside OMP_NUM_THREADS when graft wrote it: children and re-checks tell graft's own choice
# (which may change) from the user's (which never does)
_CHOSEN = "GRAFT_CHOSEN_THREADS"
SAMPLE_S = 0.2  # the first look: long enough to see a busy core, short enough for every command
RECHECK_S = 30.0  # long jobs look again this often


@dataclass(frozen=True)
class CpuSample:
    busy: int  # jiffies the sampled CPUs spent on anything but idle and iowait
    total: int  # all their jiffies
    own: int  # jiffies this process (all its threads) ran
    cpus: int  # how many CPUs were summed


def cpu_sample(cpus: set[int] | None = None, proc: str = "/proc") -> CpuSample | None:
    """The busy and total time of `cpus` (default: the ones this process may run on) and this
    process's own time, or None where /proc/stat is not there (not Linux)."""
    if cpus is None:
        cpus = os.sched_getaffinity(0)
    busy = total = 0
    try:
        with open(os.path.join(proc, "stat")) as fh:
            for line in fh:
                name, *fields = line.split()
                if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
                    continue
                # user nice system idle iowait irq softirq steal (guest time is inside user)
                v = [int(x) for x in fields[:8]] + [0] * (8 - len(fields[:8]))
                idle = v[3] + v[4]
                busy += sum(v) - idle
                total += sum(v)
        with open(os.path.join(proc, "self", "stat")) as fh:
            after_name = fh.read().rsplit(")", 1)[1].split()
        own = int(after_name[11]) + int(after_name[12])  # utime, stime
    except (OSError, ValueError, IndexError):
        return None
    return CpuSample(busy, total, own, len(cpus))


def others_busy(before: CpuSample, after: CpuSample) -> float:
    """Cores other processes kept busy between the two samples (this process's time left out)."""
    elapsed = (after.total - before.total) / max(1, after.cpus)  # jiffies per CPU
    if elapsed <= 0:
        return 0.0
    others = (after.busy - before.busy) - (after.own - before.own)
    return max(0.0, others / elapsed)


def threads_for(cpus: int, busy: float) -> int:
    """Threads for the cores no one else is running on (rounded), never fewer than one."""
    return max(1, min(cpus, int(cpus - busy + 0.5)))


def chosen_by_user(env) -> bool:
    value = env.get("OMP_NUM_THREADS")
    return bool(value) and value != env.get(_CHOSEN)


def choose_threads(cpus: int, busy: float, env) -> tuple[int | None, str]:
    """(threads to use, or None to leave torch's default; the one-line reason). `cpus` is
    what this process may run on, `busy` the cores other processes keep busy right now."""
    if chosen_by_user(env):
        return None, ""
    threads = threads_for(cpus, busy)
    if threads >= cpus:
        return None, ""
    return threads, (f"graft: {cpus} CPU cores, {busy:.1f} busy with other work right now: "
                     f"using {_n(threads)} (set OMP_NUM_THREADS to choose)")


def _n(threads: int) -> str:
    return f"{threads} torch thread{'s' if threads > 1 else ''}"


def _say(why: str, out, log_format: str) -> None:
    if log_format == "json":
        from datetime import datetime, timezone

        why = json.dumps({"time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
                          "level": "INFO", "logger": "graft.threads", "message": why})
    print(why, file=out or sys.stderr, flush=True)


def apply_thread_choice(env=None, out=None, log_format: str = "text", proc: str = "/proc",
                        sample_s: float = SAMPLE_S, sleep=time.sleep) -> int | None:
    """Choose once per process (the environment carries the choice to child processes) and
    say so on stderr (as one JSON log object when the command logs JSON, like `graft serve
    --log-format json`); returns the thread count set, or None."""
    env = os.environ if env is None else env
    if chosen_by_user(env):
        return None
    try:
        cpus = os.sched_getaffinity(0)
    except (AttributeError, OSError):  # no affinity on this OS: leave torch's default
        return None
    before = cpu_sample(cpus, proc)
    if before is None:
        return None
    sleep(sample_s)
    after = cpu_sample(cpus, proc)
    if after is None:
        return None
    threads, why = choose_threads(len(cpus), others_busy(before, after), env)
    if threads is None:
        if env.get(_CHOSEN):  # a parent process's choice that no longer holds here
            for name in ("OMP_NUM_THREADS", _CHOSEN):
                env.pop(name, None)
        return None
    env["OMP_NUM_THREADS"] = env[_CHOSEN] = str(threads)
    if "torch" in sys.modules:  # already loaded: its pool size is set directly
        sys.modules["torch"].set_num_threads(threads)
    _say(why, out, log_format)
    return threads


def _log(message: str) -> None:
    """Through the job's logging where it logs INFO (a server's JSON lines), else on stderr."""
    import logging

    log = logging.getLogger("graft.threads")
    if log.isEnabledFor(logging.INFO):
        log.info(message)
    else:
        print(message, file=sys.stderr, flush=True)


class ThreadRecheck:
    """For long jobs (training, quantize, serve): `tick()` between steps, on the thread that
    runs torch (torch's thread count belongs to the calling thread). Every `period_s` it
    measures what other processes ran since the last look and sets the torch thread count to
    the cores they left free, saying so in one line (`say`) when it changes. Inert when the
    user set OMP_NUM_THREADS or the machine has no /proc."""

    def __init__(self, period_s: float = RECHECK_S, env=None, say=None, proc: str = "/proc",
                 clock=time.monotonic):
        env = os.environ if env is None else env
        self.period_s, self.say, self.proc, self.clock = period_s, say or _log, proc, clock
        self.cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
        self.last = None if chosen_by_user(env) or not self.cpus else cpu_sample(self.cpus, proc)
        self.last_t = clock()

    def tick(self) -> int | None:
        """The new thread count when it changed now, else None (cheap between looks)."""
        if self.last is None or self.clock() - self.last_t < self.period_s:
            return None
        sample = cpu_sample(self.cpus, self.proc)
        if sample is None:
            return None
        busy, seconds = others_busy(self.last, sample), self.clock() - self.last_t
        self.last, self.last_t = sample, self.clock()
        import torch

        threads = threads_for(len(self.cpus), busy)
        if threads == torch.get_num_threads():
            return None
        torch.set_num_threads(threads)
        self.say(f"graft: {len(self.cpus)} CPU cores, {busy:.1f} busy with other work over the "
                 f"last {seconds:.0f} s: now using {_n(threads)} (set OMP_NUM_THREADS to choose)")
        return threads
