"""Hand back the calling thread's OpenMP worker threads.

libgomp (torch's OpenMP runtime on Linux, shared by graft's C kernels) keeps a pool of worker
threads for every thread that ever ran a parallel region. Once the pools together hold more
threads than the process has CPUs, it stops spinning between regions and puts the workers to
sleep, so every parallel region waits on a futex wake-up. A server loads the model on one
thread, warms it up on another and steps the engine on a third: measured on 2 cores, decode
steps ran 1.5x slower (SmolLM2 bf16, batch 16: 37 against 23 ms) until the other threads'
pools were released (docs/serving.md, docs/benchmarks.md 2026-12-03).
"""

from __future__ import annotations

import ctypes
import os

_SOFT = 1  # omp_pause_soft: free the threads, keep nothing else


def _runtimes() -> list:
    """omp_pause_resource_all of each libgomp this process has loaded (torch's, and the
    system's if graft's C kernels brought a second one)."""
    paths = {"libgomp.so.1"}
    try:
        with open("/proc/self/maps") as maps:
            paths |= {line.split()[-1] for line in maps if "libgomp" in os.path.basename(line.strip())}
    except OSError:
        pass
    fns = []
    for path in sorted(paths):
        try:
            fn = ctypes.CDLL(path).omp_pause_resource_all
        except (OSError, AttributeError):
            continue
        fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_int]
        fns.append(fn)
    return fns


def release_thread_pool() -> bool:
    """Free the calling thread's OpenMP worker threads (the next parallel region on this thread
    starts new ones). Call it on a thread that is done computing, before another thread takes
    over. True when a libgomp was found and released them."""
    return any([fn(_SOFT) == 0 for fn in _runtimes()])
