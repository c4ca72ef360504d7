"""The thread choice is a pure function of (cores, load, environment): no machine speed involved."""

import io

from graft.threads import apply_thread_choice, choose_threads


def test_an_explicit_omp_num_threads_is_never_overridden():
    assert choose_threads(2, 9.0, {"OMP_NUM_THREADS": "2"}) == (None, "")
    env = {"OMP_NUM_THREADS": "3"}
    assert apply_thread_choice(env, io.StringIO()) is None
    assert env == {"OMP_NUM_THREADS": "3"}


def test_an_idle_machine_keeps_torch_default():
    assert choose_threads(16, 0.2, {}) == (None, "")
    assert choose_threads(2, 0.4, {}) == (None, "")


def test_busy_cores_leave_the_free_ones_and_say_so_in_one_line():
    threads, why = choose_threads(16, 6.0, {})
    assert threads == 10
    assert why == ("graft: 16 CPU cores, load 6.0 from other work: using 10 torch threads "
                   "(set OMP_NUM_THREADS to choose)")
    # oversubscribed: one thread, never zero
    assert choose_threads(2, 3.1, {})[0] == 1
    assert choose_threads(2, 1.2, {})[0] == 1
    assert "\n" not in choose_threads(2, 40.0, {})[1]


def test_the_graft_command_chooses_in_a_fresh_process(tmp_path):
    """`graft` from a shell with OMP_NUM_THREADS unset: the choice (if the machine is busy at
    that moment) is one line on stderr and the environment carries it; never two lines."""
    import os
    import subprocess
    import sys

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


def test_a_json_logging_command_says_it_as_one_json_object(monkeypatch):
    """`graft serve --log-format json` promises one JSON object per stderr line."""
    import json

    import graft.threads as threads

    monkeypatch.setattr(threads.os, "getloadavg", lambda: (40.0, 0.0, 0.0))  # a busy machine
    out, env = io.StringIO(), {}
    assert apply_thread_choice(env, out, log_format="json") == 1
    row = json.loads(out.getvalue())
    assert row["logger"] == "graft.threads" and row["level"] == "INFO"
    assert row["message"].endswith("using 1 torch thread (set OMP_NUM_THREADS to choose)")
    assert env == {"OMP_NUM_THREADS": "1"}
