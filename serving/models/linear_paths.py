"""Which path each linear of a loaded model held in the C layout takes per row bucket (the C
kernel or torch over the dequantized weight, graft.kernels.linear_dispatch): timed once per
(rows bucket, in, out, format) on this machine and cached, at engine load."""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from pathlib import Path

import torch

from graft.kernels import quant_linear
from graft.kernels import linear_dispatch as ld
from graft.serving.models.layers import Linear

log = logging.getLogger("graft.serving")


def c_layout_linears(model) -> dict[tuple[str, int, int], list[Linear]]:
    """{(format, in, out): linears} of the model's projections in the C layout (the output
    head is left out: its calls have one row per sampled sequence, never a prompt's)."""
    groups = defaultdict(list)
    for name, m in model.named_modules():
        if (isinstance(m, Linear) and m.quantized is not None and "cpu" in m.quantized.packed
                and name != "lm_head"):
            groups[(m.quantized.scheme.name, m.in_features, m.out_features)].append(m)
    return dict(groups)


def _runners(groups, dtype: torch.dtype):
    """Case -> {path: a call on the first linear of its shape, with random rows}."""
    def runners(case: ld.Case) -> dict:
        lin = groups[(case.fmt, case.in_features, case.out_features)][0]
        x = torch.randn(case.rows, case.in_features, generator=torch.Generator().manual_seed(0)).to(dtype)
        w, b = lin.quantized, lin.bias

        def c():
            with torch.inference_mode():
                return quant_linear(x, w, b)

        def via_torch():
            with torch.inference_mode():
                return ld.torch_linear(x, w, b)

        return {"c": c, "torch": via_torch}
    return runners


def plan_linear_paths(model, mode: str, dtype: torch.dtype, cache_dir: Path | None = None,
                      budget_s: float = ld.BUDGET_S, clock=time.perf_counter) -> dict:
    """Set each C-layout linear's torch_buckets by `mode` (graft.kernels.linear_dispatch.MODES:
    measure | cached time and pick, c | torch fix the path); returns what was chosen (for the
    load log and `graft bench engine`'s JSON)."""
    groups = c_layout_linears(model)
    cases = [ld.Case(fmt, i, o, rows) for (fmt, i, o) in groups for rows in ld.ROW_BUCKETS]
    summary = {"mode": mode, "timings_file": None, "timed_now": 0}
    if not cases or mode == "c":
        picks = {case.key: "c" for case in cases}
    elif mode == "torch":
        picks = {case.key: "torch" for case in cases}
    else:
        where = ld.machine()
        path = ld.cache_file(cache_dir, where)
        timings = ld.load_timings(path)  # other models' shapes stay in the file
        todo = [c for c in cases if mode == "measure" or c.key not in timings]
        if todo:
            new = ld.measure(todo, _runners(groups, dtype), None if mode == "measure" else budget_s,
                             clock)
            timings.update(new)
            summary["timed_now"] = len(new)
            try:
                ld.save_timings(path, timings, where)
            except OSError as err:  # e.g. a read-only home: this process still uses them
                log.warning("linear dispatch timings not saved (%s); set GRAFT_KERNEL_CACHE to "
                            "a writable folder to keep them", err)
        picks = ld.choose({c.key: timings[c.key] for c in cases if c.key in timings})
        summary["timings_file"] = str(path)
    for (fmt, i, o), linears in groups.items():
        chosen = frozenset(rows for rows in ld.ROW_BUCKETS
                           if picks.get(ld.Case(fmt, i, o, rows).key) == "torch")
        for lin in linears:
            lin.torch_buckets = chosen
    summary["choices"] = {c.key: picks.get(c.key, "c") for c in cases}
    log.info("C-layout linears: %s", describe(summary))
    return summary


def describe(summary: dict) -> str:
    """One line for the load log: where the torch path runs, or that the C kernels run all."""
    on_torch = [k for k, v in summary["choices"].items() if v == "torch"]
    where = (f"torch path for {len(on_torch)} of {len(summary['choices'])} (shape, rows) cases "
             f"({', '.join(on_torch[:4])}{', ...' if len(on_torch) > 4 else ''})"
             if on_torch else "C kernels at every row count")
    timed = f", {summary['timed_now']} timed now" if summary["timed_now"] else ""
    return f"{where} (--linear-dispatch {summary['mode']}{timed})"
