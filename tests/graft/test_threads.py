"""The thread choice reads what runs now (CPU busy time over a short sample, this process's own
time left out), never the load average: a fake /proc pins the arithmetic, a real busy process
the measurement, and long jobs look again and speed up once other work ends."""

import io
import json
import os
import subprocess
import sys
import threading

import pytest
import torch

import graft.threads as T
from graft.threads import (ThreadRecheck, apply_thread_choice, choose_threads, cpu_sample,
                           others_busy)


class FakeProc:
    """A /proc with two CPUs whose counters the test advances (jiffies)."""

    def __init__(self, root):
        self.root, self.cpu, self.own = root, [[0, 0], [0, 0]], 0  # per CPU [busy, idle]
        (root / "self").mkdir(parents=True)
        self.write()

    def write(self):
        rows = [f"cpu{i} {busy} 0 0 {idle} 0 0 0 0 0 0" for i, (busy, idle) in enumerate(self.cpu)]
        total = [sum(c[0] for c in self.cpu), sum(c[1] for c in self.cpu)]
        (self.root / "stat").write_text(f"cpu {total[0]} 0 0 {total[1]} 0 0 0 0 0 0\n"
                                        + "\n".join(rows) + "\nprocs_running 3\n")
        (self.root / "self" / "stat").write_text(
            "42 (py (x)) R 1 1 1 0 -1 0 0 0 0 0 " + f"{self.own} 0 " + "0 " * 30)

    def advance(self, busy: tuple, own: int = 0, jiffies: int = 100):
        """Each CPU busy for busy[i] of `jiffies`; this process ran `own` of those."""
        for c, b in zip(self.cpu, busy):
            c[0] += int(b * jiffies)
            c[1] += jiffies - int(b * jiffies)
        self.own += own
        self.write()


@pytest.fixture
def proc(tmp_path, monkeypatch):
    monkeypatch.setattr(T.os, "sched_getaffinity", lambda pid: {0, 1})
    return FakeProc(tmp_path / "proc")


def test_an_explicit_omp_num_threads_is_never_overridden(proc):
    assert choose_threads(2, 1.9, {"OMP_NUM_THREADS": "2"}) == (None, "")
    env = {"OMP_NUM_THREADS": "3"}
    assert apply_thread_choice(env, io.StringIO(), proc=str(proc.root), sleep=lambda s: None) is None
    assert env == {"OMP_NUM_THREADS": "3"}
    # graft's own choice, carried to a child through the environment, is graft's to change
    assert choose_threads(2, 0.0, {"OMP_NUM_THREADS": "1", T._CHOSEN: "1"}) == (None, "")
    assert choose_threads(2, 1.0, {"OMP_NUM_THREADS": "1", T._CHOSEN: "1"})[0] == 1


def test_busy_cores_leave_the_free_ones_and_say_so_in_one_line():
    assert choose_threads(16, 0.2, {}) == (None, "") and choose_threads(2, 0.4, {}) == (None, "")
    threads, why = choose_threads(16, 6.0, {})
    assert threads == 10
    assert why == ("graft: 16 CPU cores, 6.0 busy with other work right now: using 10 torch "
                   "threads (set OMP_NUM_THREADS to choose)")
    assert choose_threads(2, 3.1, {})[0] == 1 and choose_threads(2, 1.2, {})[0] == 1  # never 0
    assert "\n" not in choose_threads(2, 40.0, {})[1]


def test_the_sample_counts_other_work_not_our_own(proc):
    def sleep(seconds, busy=(1.0, 0.5), own=60):  # what runs while the choice samples
        proc.advance(busy, own=own)

    before = cpu_sample({0, 1}, str(proc.root))
    proc.advance((1.0, 0.5), own=60)
    after = cpu_sample({0, 1}, str(proc.root))
    assert others_busy(before, after) == pytest.approx(0.9)  # 150 busy - 60 ours, per 100
    assert cpu_sample({1}, str(proc.root)).total == proc.cpu[1][0] + proc.cpu[1][1]  # affinity
    env, out = {}, io.StringIO()
    assert apply_thread_choice(env, out, proc=str(proc.root), sleep=sleep) == 1
    assert out.getvalue() == ("graft: 2 CPU cores, 0.9 busy with other work right now: using 1 "
                              "torch thread (set OMP_NUM_THREADS to choose)\n")
    assert env == {"OMP_NUM_THREADS": "1", T._CHOSEN: "1"}
    # the same process, busy only with itself: nothing to give up, and a parent's stale choice
    # is dropped so torch takes every core
    out = io.StringIO()
    assert apply_thread_choice(env, out, proc=str(proc.root),
                               sleep=lambda s: sleep(s, (1.0, 1.0), own=190)) is None
    assert env == {} and out.getvalue() == ""


def test_a_long_job_speeds_up_once_other_work_ends(proc):
    now = [0.0]
    said, default = [], torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        recheck = ThreadRecheck(period_s=30, env={}, say=said.append, proc=str(proc.root), clock=lambda: now[0])
        proc.advance((1.0, 1.0), own=100)  # we run on one core, another job on the other
        now[0] = 10.0
        assert recheck.tick() is None  # not yet time to look
        now[0] = 31.0
        assert recheck.tick() == 1 and torch.get_num_threads() == 1
        proc.advance((1.0, 0.0), own=100)  # the other job ended; we keep our one core busy
        now[0] = 62.0
        assert recheck.tick() == 2 and torch.get_num_threads() == 2
        proc.advance((1.0, 1.0), own=200)  # both cores ours: no change, no line
        now[0] = 93.0
        assert recheck.tick() is None
        assert said == [
            "graft: 2 CPU cores, 1.0 busy with other work over the last 31 s: now using 1 torch "
            "thread (set OMP_NUM_THREADS to choose)",
            "graft: 2 CPU cores, 0.0 busy with other work over the last 31 s: now using 2 torch "
            "threads (set OMP_NUM_THREADS to choose)"]
        user = ThreadRecheck(period_s=0, env={"OMP_NUM_THREADS": "2"}, proc=str(proc.root))
        proc.advance((1.0, 1.0))
        assert user.tick() is None and torch.get_num_threads() == 2  # the user's choice stands
    finally:
        torch.set_num_threads(default)


def _spin(stop: threading.Event) -> None:
    while not stop.is_set():
        pass


def test_a_real_busy_process_is_seen(tmp_path):
    """A spinning process pinned to one CPU: the sample over this process's CPUs sees a core
    busy (other work on this machine can only add to it), and a spinning thread of our own is
    not counted as others'. Sampled over all of them, as graft does: this process's own time,
    which it subtracts, is spent on any of them."""
    stop = threading.Event()
    ours = threading.Thread(target=_spin, args=(stop,), daemon=True)
    cpu = min(os.sched_getaffinity(0))
    spin = subprocess.Popen([sys.executable, "-c", "import os, sys; os.sched_setaffinity(0, {%d}); "
                             "print('ready', flush=True)\nwhile True: pass" % cpu],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert spin.stdout.readline() == "ready\n"
        ours.start()
        before = cpu_sample()
        import time

        time.sleep(0.5)
        busy = others_busy(before, cpu_sample())
    finally:
        stop.set()
        spin.kill()
        spin.wait()
    assert busy >= 0.7
    assert choose_threads(2, busy, {})[0] == 1  # of two cores, the busy one is left alone


def test_the_graft_command_chooses_in_a_fresh_process(tmp_path):
    """`graft` from a shell with OMP_NUM_THREADS unset: the choice (if the machine is busy at
    that moment) is one line on stderr and the environment carries it; never two lines."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    code = ("import os, sys; sys.argv = ['graft', 'data', 'quickstart', '--out', %r, "
            "'--train-scenes', '2', '--val-scenes', '1', '--digits-test', '2', '--digits-train', '2']; "
            "from graft.cli import main; rc = main(); print(rc, os.environ.get('OMP_NUM_THREADS'))"
            % str(tmp_path / "d"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    rc, threads = out.stdout.splitlines()[-1].split()
    said = [ln for ln in out.stderr.splitlines() if ln.startswith("graft: ")]
    assert rc == "0" and len(said) <= 1
    assert (threads == "None") == (not said)  # set exactly when it was said
    if said:
        assert said[0].endswith(f"using {threads} torch thread{'s' if int(threads) > 1 else ''} "
                                "(set OMP_NUM_THREADS to choose)")


def test_a_json_logging_command_says_it_as_one_json_object(proc):
    """`graft serve --log-format json` promises one JSON object per stderr line."""
    out, env = io.StringIO(), {}
    assert apply_thread_choice(env, out, log_format="json", proc=str(proc.root),
                               sleep=lambda s: proc.advance((1.0, 1.0))) == 1
    row = json.loads(out.getvalue())
    assert row["logger"] == "graft.threads" and row["level"] == "INFO"
    assert row["message"].endswith("using 1 torch thread (set OMP_NUM_THREADS to choose)")
    assert env == {"OMP_NUM_THREADS": "1", T._CHOSEN: "1"}
