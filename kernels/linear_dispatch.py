"""Which path runs a multi-row CPU linear whose weight is in the C layout: the C kernel
(graft.kernels.cpu_quant) or torch (the weight dequantized to fp32 for the call, then F.linear
on MKL/oneDNN: the reference, quant_formats.quant_linear, without keeping the fp32 copy).
Both compute x @ dequantize(w).T in fp32, so they differ only in summation order.

Which is faster depends on the rows (the C kernels stream the weight once for all rows; the
GEMM libraries win on large row counts where the C fp32 path, say, loses to oneDNN's blocking),
the shape, the format and the machine. So the engine times both paths once per (rows bucket,
in, out, format) of the model it loads (`measure`), keeps the timings in a JSON file per
machine (CPU model and flags, torch version, threads, C library) and picks with `choose`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from graft.errors import GraftConfigError
from graft.kernels.quant_formats import linear_input

ROW_BUCKETS = (1, 8, 32, 128, 512)  # a call of R rows takes the choice of the nearest bucket
MODES = ("measure", "cached", "c", "torch")
PATHS = ("c", "torch")
ENV = "GRAFT_LINEAR_DISPATCH"  # the mode when the engine option is not given
MARGIN = 0.05  # torch must be this much faster: ties keep the C kernel (no fp32 copy per call)
BUDGET_S = 2.0  # timing per engine load in `cached` mode; what is left is timed at later loads
FILE_VERSION = 1


def resolve_mode(option: str | None) -> str:
    """The engine option, else $GRAFT_LINEAR_DISPATCH, else `cached`; validated."""
    mode = option or os.environ.get(ENV, "").strip().lower() or "cached"
    if mode not in MODES:
        where = "EngineConfig.linear_dispatch" if option else ENV
        raise GraftConfigError(f"{where}={mode!r} is not one of {', '.join(MODES)}")
    return mode


def bucket(rows: int) -> int:
    """The row bucket nearest to `rows` on a log scale."""
    r = max(rows, 1)
    return min(ROW_BUCKETS, key=lambda b: abs(math.log(r / b)))


@dataclass(frozen=True)
class Case:
    """One timed shape: `rows` (a bucket) of `in_features` through a `fmt` weight [out, in]."""

    fmt: str
    in_features: int
    out_features: int
    rows: int

    @property
    def key(self) -> str:
        return f"{self.fmt}:{self.in_features}x{self.out_features}:r{self.rows}"


def choose(timings: dict[str, dict[str, float]]) -> dict[str, str]:
    """{case key: "c" | "torch"} from {case key: {"c": seconds, "torch": seconds}}: torch
    where it is more than MARGIN faster, else the C kernel (also where a time is missing)."""
    picks = {}
    for key, t in timings.items():
        c, tt = t.get("c"), t.get("torch")
        picks[key] = "torch" if c is not None and tt is not None and tt < c * (1 - MARGIN) else "c"
    return picks


def torch_linear(x: torch.Tensor, weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """quant_formats.quant_linear's contract on the torch path: the weight is dequantized for
    this call only (after pack_only the canonical tensors are rebuilt and dropped again)."""
    w = weight.dequantize(keep=False)  # [N, K] fp32
    out = F.linear(linear_input(x, weight.scheme), w, None if bias is None else bias.float())
    return out.to(x.dtype)


def machine() -> dict:
    """What the timings hold for: another CPU, torch, thread count or C library measures anew."""
    from graft.kernels import cpu_ops

    cpu = cpu_ops._cpu_model()
    model = next((line.split(":", 1)[1].strip() for line in cpu.splitlines()
                  if line.startswith("model name")), cpu)
    return {"cpu": model, "cpu_flags": hashlib.sha256(cpu.encode()).hexdigest()[:16],
            "torch": torch.__version__, "threads": torch.get_num_threads(),
            "c_library": Path(cpu_ops._lib()._name).name}


def cache_file(directory: Path | None = None, where: dict | None = None) -> Path:
    """The timings file of this machine (`where`: machine()) in `directory` (default: the C
    kernels' cache, $GRAFT_KERNEL_CACHE or ~/.cache/graft/kernels)."""
    from graft.kernels import cpu_ops

    where = where if where is not None else machine()
    digest = hashlib.sha256(json.dumps(where, sort_keys=True).encode()).hexdigest()[:16]
    return (directory or cpu_ops.cache_dir()) / f"linear-dispatch-{digest}.json"


def load_timings(path: Path) -> dict[str, dict[str, float]]:
    """The timings in `path`; {} when it is missing, unreadable or of another version."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != FILE_VERSION:
        return {}
    return {k: v for k, v in data.get("timings", {}).items() if isinstance(v, dict)}


def save_timings(path: Path, timings: dict[str, dict[str, float]], where: dict) -> None:
    """Write timings (with the machine they hold for) atomically: a concurrent load reads the
    old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump({"version": FILE_VERSION, "machine": where, "timings": timings}, fh,
                      indent=1, sort_keys=True)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def time_case(run: dict[str, Callable[[], object]], clock=time.perf_counter) -> dict[str, float]:
    """{path: seconds} of the fastest call of each path in `run`, the paths alternating; a
    warm-up call of each first (first-touch allocations), then a few ms of calls."""
    best = {}
    for name, fn in run.items():
        t0 = clock()
        fn()
        best[name] = clock() - t0
    repeats = max(1, min(5, int(0.004 / max(max(best.values()), 1e-6))))
    for _ in range(repeats):
        for name, fn in run.items():
            t0 = clock()
            fn()
            best[name] = min(best[name], clock() - t0)
    return best


def measure(cases: list[Case], runners: Callable[[Case], dict[str, Callable[[], object]]],
            budget_s: float | None, clock=time.perf_counter) -> dict[str, dict[str, float]]:
    """Time the paths `runners(case)` gives for each case (largest row buckets first: prefill
    is what the choice is for), stopping once `budget_s` seconds are spent (None: no bound)."""
    timings, start = {}, clock()
    for case in sorted(cases, key=lambda c: (-c.rows, -c.in_features * c.out_features, c.key)):
        if budget_s is not None and clock() - start >= budget_s:
            break
        timings[case.key] = time_case(runners(case), clock)
    return timings
