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
