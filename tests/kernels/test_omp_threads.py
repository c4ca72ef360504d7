"""graft.kernels.omp_threads: a thread that is done computing hands its OpenMP workers back,
so that the engine thread's pool is the only one (more pools than CPUs put libgomp's workers
to sleep between parallel regions)."""

import os
import threading

import pytest
import torch

from graft.kernels.omp_threads import release_thread_pool

needs_linux_pool = pytest.mark.skipif(
    not os.path.isdir("/proc/self/task") or torch.get_num_threads() < 2,
    reason="needs Linux and torch running 2 or more OpenMP threads")


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


@needs_linux_pool
def test_a_thread_releases_its_workers():
    counts = {}

    def work():
        a = torch.randn(512, 512)
        (a @ a).sum()  # an OpenMP region on this thread: it gets its own workers
        counts["busy"] = _threads()
        counts["released"] = release_thread_pool()
        counts["after"] = _threads()

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert counts["released"] is True
    assert counts["after"] < counts["busy"]


def test_release_without_a_pool_is_harmless():
    release_thread_pool()
    assert release_thread_pool() in (True, False)
    a = torch.randn(64, 64)
    torch.testing.assert_close(a @ torch.eye(64), a)  # the next region starts new workers
