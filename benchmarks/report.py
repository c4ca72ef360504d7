"""What the serving benchmarks report with: latency percentiles and the JSON report's output."""

from __future__ import annotations

import json
import statistics


def percentiles(values: list[float], scale: float = 1000.0) -> dict[str, float | None]:
    """p50/p90/p99/mean of `values` times `scale` (seconds -> ms by default), and n."""
    import numpy as np

    if not values:
        return {"p50": None, "p90": None, "p99": None, "mean": None, "n": 0}
    a = np.asarray(values) * scale
    return {"p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99)), "mean": float(a.mean()), "n": len(values)}


def spread(values: list[float]) -> dict[str, float]:
    """min/median/max of repeated runs: how a figure in the docs is given."""
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def emit(report: dict, out: str | None) -> None:
    """The JSON report to `out` (written atomically), or to stdout without one."""
    from graft.io import atomic_write_text

    text = json.dumps(report, indent=2, default=str)
    if out:
        atomic_write_text(out, text)
    else:
        print(text)
