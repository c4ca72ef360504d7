"""Compare two eval runs task by task: delta of the headline score with a paired bootstrap CI."""

from __future__ import annotations

from pathlib import Path

from graft.errors import GraftDataError
from graft.evals.metrics import METRICS
from graft.evals.report import format_ci, format_table, read_results, read_samples
from graft.evals.stats import check_n_boot, columns_of, group_index, paired_bootstrap


def compare_runs(run_a: str | Path, run_b: str | Path, n_boot: int = 1000, seed: int = 0) -> dict:
    """Per shared task: B - A on the samples both runs answered (matched by sample id)."""
    check_n_boot(n_boot)
    dir_a, dir_b = Path(run_a), Path(run_b)
    res_a, res_b = read_results(dir_a), read_results(dir_b)
    dir_a = dir_a if dir_a.is_dir() else dir_a.parent
    dir_b = dir_b if dir_b.is_dir() else dir_b.parent
    shared = [t for t in res_a["tasks"] if t in res_b["tasks"]]
    if not shared:
        raise GraftDataError(f"{run_a} and {run_b} have no task in common")
    out = {"a": str(run_a), "b": str(run_b), "tasks": {}}
    for task in shared:
        metric_name = res_a["tasks"][task]["metrics"][0]
        if metric_name not in METRICS:
            raise GraftDataError(f"{dir_a}: task {task} names metric {metric_name!r}, which this graft "
                                 f"does not have ({', '.join(METRICS)})")
        metric = METRICS[metric_name]
        rows_a = {r["id"]: r for r in read_samples(dir_a, task)}
        rows_b = {r["id"]: r for r in read_samples(dir_b, task)}
        ids = [i for i in rows_a if i in rows_b]
        if not ids:
            raise GraftDataError(f"task {task}: the two runs share no sample ids")
        cols_a = columns_of([rows_a[i]["scores"] for i in ids])
        cols_b = columns_of([rows_b[i]["scores"] for i in ids])
        groups = group_index([rows_a[i].get("group") or i for i in ids])
        stats = paired_bootstrap(metric.aggregate, metric.primary, cols_a, cols_b, groups, n_boot, seed)
        out["tasks"][task] = {"metric": metric.primary, "n": len(ids),
                              "a": metric.aggregate(cols_a, groups)[metric.primary],
                              "b": metric.aggregate(cols_b, groups)[metric.primary], **stats}
    return out


def compare_table(report: dict) -> str:
    rows = []
    for task, t in report["tasks"].items():
        rows.append([task, t["metric"], t["n"], f"{t['a']:.4f}", f"{t['b']:.4f}", f"{t['delta']:+.4f}",
                     format_ci(t["ci"], "+.4f")])
    return format_table(["task", "metric", "n", "A", "B", "B-A", "95% CI"], rows)
