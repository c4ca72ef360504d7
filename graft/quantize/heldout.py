"""Re-scoring chosen configurations on the held-out split (never seen by the search), with
bootstrap CIs, written as `graft eval` run folders so `graft eval compare` reads them; the
paired difference against fp32 comes from that same compare code."""

from __future__ import annotations

import copy
from pathlib import Path


def rescore(qe, ev, named: dict[str, dict], out_dir: Path, n_boot: int, seed: int) -> dict:
    """named: {folder name: point}; "fp32" is scored first and every other one is compared
    against it. Returns {name: {"dir", "quality", "tasks": {task: {score, ci, n}}, "vs_fp32"}}."""
    from graft.evals.compare import compare_runs
    from graft.evals.report import now_utc, write_results, write_samples
    from graft.evals.runner import eval_task

    fp32 = qe.plan_backend(ev.plan({}))
    out: dict[str, dict] = {}
    for name, point in sorted(named.items(), key=lambda kv: kv[0] != "fp32"):
        run_dir = Path(out_dir) / "heldout" / name
        backend = qe.plan_backend(ev.plan(point["assignment"]))
        results = {"tasks": {}, "config": {
            "model": str(qe.engine.model_dir), "backend": "engine", "model_identity": backend.identity,
            "quantization": point["key"], "split": "heldout", "n_boot": n_boot, "task_specs": {}},
            "seed": seed, "created": now_utc()}
        for split in ev.splits:
            samples = copy.deepcopy(split.heldout)  # a base_llm task writes targets into them
            summary, rows = eval_task(split.spec, samples, backend, lambda: fp32, None, n_boot, seed)
            results["tasks"][split.spec.name] = summary
            results["config"]["task_specs"][split.spec.name] = split.spec.to_dict()
            write_samples(run_dir, split.spec.name, rows)
        write_results(run_dir, results)
        tasks = {t: {"score": s["score"], "ci": s["ci"], "n": s["n"]} for t, s in results["tasks"].items()}
        out[name] = {"dir": str(run_dir), "key": point["key"], "tasks": tasks,
                     "quality": sum(t["score"] for t in tasks.values()) / len(tasks)}
        if name != "fp32":
            out[name]["vs_fp32"] = compare_runs(Path(out_dir) / "heldout" / "fp32", run_dir,
                                                n_boot=n_boot, seed=seed)["tasks"]
    return out


def pick(front: list[dict], chosen: dict, extra: int) -> list[dict]:
    """The chosen point plus up to `extra` other front points, spread evenly over bytes."""
    others = [p for p in front if p["key"] != chosen["key"]]
    if extra <= 0 or not others:
        return [chosen]
    step = max(1, len(others) / extra)
    return [chosen] + [others[int(i * step)] for i in range(min(extra, len(others)))]
