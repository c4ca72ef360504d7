"""quantize_search: the whole `graft quantize` run, from a model dir to the files in --out.

Outputs: state.json (resumable), evaluated.jsonl (every measured assignment, measured and
additively predicted quality), pareto.json + pareto.png, quant.json (the chosen
configuration, loadable by EngineConfig(quantization=...) and every --quantization flag) and
heldout/<name>/ (graft eval run folders of the held-out re-scoring).
"""

from __future__ import annotations

import json
from pathlib import Path

from graft.errors import GraftConfigError
from graft.quantize.evaluator import EvalSettings
from graft.quantize.pareto import Goal

_POINT_FIELDS = ("key", "phase", "quality", "predicted_quality", "kl", "predicted_kl",
                 "tokens_per_s", "weight_bytes", "complete", "upper_bound", "tasks", "assignment")


def quantize_search(model: str | Path, tasks: list[str], out_dir: str | Path,
                    goal: Goal = Goal("drop", 0.01), data_root=None,
                    settings: EvalSettings | None = None, max_evals: int = 16, beam: int = 3,
                    heldout_points: int = 2, n_boot: int = 1000, seed: int = 0,
                    device: str = "cpu", fresh: bool = False, progress: bool = True,
                    log=print, engine_config=None) -> dict:
    """Search per-group schemes for `model` (run dir or LLM dir) on `tasks`; returns the
    pareto.json dict; `engine_config` (an EngineConfig) sets the engine options, else defaults
    on `device`. Bad input fails before the model loads, with one-line errors."""
    from graft.quantize.engine import QuantEngine
    from graft.quantize.evaluator import Evaluator
    from graft.quantize.quality import load_tasks
    from graft.quantize.search import Search
    from graft.quantize.state import SearchState

    from graft.quantize.evaluator import parse_schemes
    from graft.gguf_llm import model_path
    from graft.run_dir import model_dir_kind
    from graft.quantize.groups import parse_granularity

    settings = settings or EvalSettings()
    parse_schemes(settings.schemes)  # typos fail before anything loads
    parse_granularity(settings.granularity, 1)
    path = model_path(Path(model).expanduser())  # a GGUF file: its LLM dir
    model_dir_kind(path, "MODEL")  # neither a run dir nor an LLM dir: one line naming both
    if isinstance(tasks, str):
        tasks = [t for t in tasks.split(",") if t]
    splits = load_tasks(tasks, data_root, settings.heldout_fraction, settings.split_seed,
                        settings.limit)
    out = Path(out_dir)
    qe = QuantEngine(path, device=device, config=engine_config)
    ev = Evaluator(qe, splits, settings)
    if goal.kind == "bytes":
        _check_budget(ev, goal)
    fingerprint = {"model": str(path.resolve()), "identity": qe.base_identity, "tasks": tasks,
                   "groups": ev.groups, "schemes": ev.schemes,
                   "splits": {s.spec.name: [x.id for x in s.search] for s in splits},
                   **{k: v for k, v in vars(settings).items() if k not in ("granularity", "schemes")}}
    state = SearchState(out, fingerprint, fresh)
    if state.resumed:
        log(f"resuming: {state.resumed} measured points in {state.path}")
    bar = _progress_bar(1 + len(ev.groups) * (len(ev.schemes) - 1) + len(ev.schemes) + max_evals,
                        progress)
    from graft.threads import ThreadRecheck

    recheck = ThreadRecheck()  # other work ending mid-search frees cores for the next points

    def progress(point):
        bar(point)
        recheck.tick()

    search = Search(ev, goal, state, max_evals, beam, progress=progress)
    try:
        points = search.run()
    finally:
        bar.close()
    report = write_outputs(out, points, search.base, goal, ev, qe, heldout_points, n_boot, seed)
    log(f"chosen: {report['chosen_summary']}\nwrote {out}/quant.json, pareto.json, pareto.png, "
        f"evaluated.jsonl; held-out re-scoring in {out}/heldout/")
    return report


def _check_budget(ev, goal: Goal) -> None:
    """A byte budget below every group's cheapest scheme can never be met: say so now."""
    cheapest = {g: min(ev.schemes, key=lambda s: ev.group_bytes(g, s)) for g in ev.groups}
    least = ev.weight_bytes(cheapest)
    if goal.value < least:
        raise GraftConfigError(
            f"--budget-bytes {int(goal.value)}: no configuration meets it; the closest is every "
            f"group in its cheapest scheme ({', '.join(sorted(set(cheapest.values())))}) at "
            f"{least} bytes per token")


def write_outputs(out: Path, points: list[dict], base: dict, goal: Goal, ev, qe,
                  heldout_points: int, n_boot: int, seed: int) -> dict:
    from graft.io import atomic_write_json, atomic_write_text
    from graft.quantize.groups import to_quant_config
    from graft.quantize.heldout import pick, rescore
    from graft.quantize.pareto import choose, describe_point, interaction_summary, pareto_front
    from graft.quantize.plot import plot_pareto

    lines = [json.dumps({k: p.get(k) for k in _POINT_FIELDS}) for p in points]
    atomic_write_text(out / "evaluated.jsonl", "\n".join(lines) + "\n")
    front = pareto_front(points)
    report = {"goal": {"kind": goal.kind, "value": goal.value, "text": goal.describe()},
              "split": "search", "groups": ev.modules, "baseline": {**_slim(base), "tokens_per_s_samples": base.get("tokens_per_s_samples")},
              "front": [_slim(p) for p in front], "chosen": None,
              "interactions": interaction_summary(points)}
    try:
        chosen = choose(points, goal, base)
    except GraftConfigError:
        atomic_write_json(out / "pareto.json", report)
        plot_pareto(points, front, None, out / "pareto.png")
        raise
    summary = describe_point(chosen, base)
    config = to_quant_config(chosen["assignment"], ev.modules,
                             comment=f"graft quantize ({goal.describe()}): {summary} on the search split")
    atomic_write_json(out / "quant.json", config)
    named = {"fp32": base, "chosen": chosen}
    for i, p in enumerate(pick(front, chosen, heldout_points)[1:]):
        named[f"front{i}"] = p
    report.update(chosen=_slim(chosen), chosen_summary=summary,
                  heldout=rescore(qe, ev, named, out, n_boot, seed))
    atomic_write_json(out / "pareto.json", report)
    plot_pareto(points, front, chosen, out / "pareto.png")
    return report


def _slim(p: dict) -> dict:
    return {k: p.get(k) for k in _POINT_FIELDS}


class _NoBar:
    def __call__(self, point):
        pass

    def close(self):
        pass


def _progress_bar(total: int, enabled: bool):
    """tqdm on stderr: one tick per measured (or resumed) point, the latest in the postfix."""
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    bar = tqdm(total=total, desc="graft quantize", unit="config")

    def tick(point):
        q = "stopped" if point.get("quality") is None else f"{point['quality']:.3f}"
        bar.set_postfix_str(f"{point['phase']} {point['key'][:40]} q={q}")
        bar.update(1)
    tick.close = bar.close
    return tick
