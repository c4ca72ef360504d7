"""End-to-end quality of a plan on the eval harness: task samples split into a search part and a
held-out part, scored chunk by chunk so a candidate that cannot matter stops early.

Quality is the mean over tasks of each task's headline score. `reference: base_llm` tasks get
their targets from the fp32 plan of the same engine (the frozen LLM; the engine gives HF's
greedy tokens, parity-tested), computed once.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from graft.errors import GraftConfigError

# metrics whose headline is a plain mean of per-sample scores in [0, 1]: unseen samples can add
# at most 1 each, which bounds a partly scored candidate (others never stop early)
_BOUNDED = ("exact_match", "identical")


@dataclass
class TaskSplit:
    spec: object  # graft.evals.task.TaskSpec
    search: list  # graft.evals.dataset.Sample
    heldout: list


def split_samples(samples: list, heldout_fraction: float, seed: int) -> tuple[list, list]:
    """Whole questions (rotations together) to one side, by a seeded hash of the question id:
    stable when the file grows, and independent of file order."""
    groups = sorted({s.group or s.id for s in samples},
                    key=lambda g: hashlib.sha256(f"{seed}:{g}".encode()).hexdigest())
    n_held = min(max(1, round(len(groups) * heldout_fraction)), len(groups) - 1)
    held = set(groups[:n_held])
    return ([s for s in samples if (s.group or s.id) not in held],
            [s for s in samples if (s.group or s.id) in held])


def load_tasks(tasks: list[str], data_root, heldout_fraction: float, seed: int,
               limit: int | None = None) -> list[TaskSplit]:
    from graft.evals.dataset import load_samples
    from graft.evals.task import get_task

    if not tasks:
        raise GraftConfigError("--tasks is empty: pass --tasks T1,T2 (see `graft eval --list`)")
    if not 0.0 < heldout_fraction < 1.0:
        raise GraftConfigError(f"--heldout-fraction must be in (0, 1), got {heldout_fraction}")
    out = []
    for name in tasks:
        spec = get_task(name)
        samples = load_samples(spec, data_root, limit)
        if len({s.group or s.id for s in samples}) < 2:
            raise GraftConfigError(f"task {spec.name} has one question: a search and a held-out "
                                   "split need at least two")
        out.append(TaskSplit(spec, *split_samples(samples, heldout_fraction, seed)))
    return out


def fill_references(splits: list[TaskSplit], fp32_backend) -> None:
    """Targets of `reference: base_llm` tasks: the fp32 plan's greedy answers."""
    from graft.evals.runner import build_requests, generate_cached

    for split in splits:
        if split.spec.reference != "base_llm":
            continue
        samples = split.search + split.heldout
        answers = generate_cached(fp32_backend, None, split.spec, samples,
                                  build_requests(split.spec, samples, 0))
        for sample, res in zip(samples, answers):
            if res.error is not None:
                raise GraftConfigError(f"task {split.spec.name}, sample {sample.id}: the fp32 "
                                       f"reference failed: {res.error}")
            sample.target = res.prediction


def task_score(spec, samples: list, predictions: list) -> float:
    """The task's headline score (its first metric's primary aggregate) on these samples."""
    from graft.evals.metrics import METRICS
    from graft.evals.stats import columns_of, group_index

    metric = METRICS[spec.metrics[0]]
    columns = columns_of(metric.score(predictions, samples))
    groups = group_index([s.group or s.id for s in samples])
    return float(metric.aggregate(columns, groups)[metric.primary])


class QualityMeter:
    """Scores a backend on the search split in `n_chunks` rounds over every task."""

    def __init__(self, splits: list[TaskSplit], n_chunks: int = 4):
        self.splits, self.n_chunks = splits, max(1, n_chunks)

    def __call__(self, backend, stop=None) -> dict:
        """{"quality", "tasks", "complete", "upper_bound", "answers"}; `stop(upper_bound)` is
        asked after each round and ends the measurement when it says True."""
        from graft.evals.runner import build_requests
        from graft.evals.task import load_hooks

        answers: dict[str, list] = {s.spec.name: [] for s in self.splits}
        for chunk in range(self.n_chunks):
            parts = [(split, _chunk(split.search, chunk, self.n_chunks)) for split in self.splits]
            # every task's part in one call: one continuous batch for the engine
            requests = [r for split, part in parts for r in build_requests(split.spec, part, 0)]
            results = iter(backend.generate(requests) if requests else [])
            for split, part in parts:
                hooks = load_hooks(split.spec)
                preds = [next(results).prediction for _ in part]
                if "process_prediction" in hooks:
                    preds = [p if p is None else hooks["process_prediction"](p, s)
                             for p, s in zip(preds, part)]
                answers[split.spec.name] += preds
            scores, bound = self._scores(answers)
            done = chunk == self.n_chunks - 1
            if not done and stop is not None and stop(bound):
                return {"quality": None, "tasks": scores, "complete": False,
                        "upper_bound": bound, "answers": answers}
        quality = sum(scores.values()) / len(scores)
        return {"quality": quality, "tasks": scores, "complete": True, "upper_bound": quality,
                "answers": answers}

    def _scores(self, answers: dict) -> tuple[dict, float]:
        """Scores on the samples answered so far, and the best the full split could reach."""
        scores, bounds = {}, []
        for split in self.splits:
            preds = answers[split.spec.name]
            n, k = len(split.search), len(preds)
            score = task_score(split.spec, split.search[:k], preds) if k else 0.0
            scores[split.spec.name] = score
            bounded = split.spec.metrics[0] in _BOUNDED
            bounds.append((k * score + (n - k)) / n if bounded else float("inf"))
        return scores, sum(bounds) / len(bounds)


def _chunk(samples: list, index: int, n_chunks: int) -> list:
    """The index-th of n_chunks consecutive parts, cut at question boundaries."""
    size = -(-len(samples) // n_chunks)
    lo, hi = index * size, (index + 1) * size
    while 0 < lo < len(samples) and samples[lo].group == samples[lo - 1].group and samples[lo].group:
        lo += 1
    while 0 < hi < len(samples) and samples[hi].group == samples[hi - 1].group and samples[hi].group:
        hi += 1
    return samples[lo:hi]
