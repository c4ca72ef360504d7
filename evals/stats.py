"""Bootstrap confidence intervals, resampling whole groups (e.g. circular rotations) together."""

from __future__ import annotations

from typing import Callable

import numpy as np

from graft.errors import GraftConfigError

Aggregate = Callable[[dict[str, np.ndarray], np.ndarray], dict[str, float]]


def columns_of(records: list[dict[str, float]]) -> dict[str, np.ndarray]:
    keys = records[0].keys() if records else ()
    return {k: np.array([float(r[k]) for r in records]) for k in keys}


def group_index(group_names: list[str]) -> np.ndarray:
    """Group names -> int labels in order of first appearance."""
    labels: dict[str, int] = {}
    return np.array([labels.setdefault(g, len(labels)) for g in group_names], dtype=np.int64)


def check_n_boot(n_boot: int) -> int:
    """0 resamples is allowed and means no confidence interval (ci: null); fewer is a mistake."""
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 0:
        raise GraftConfigError(f"--bootstrap (n_boot) must be a whole number >= 0, got {n_boot!r}; "
                               "0 skips the confidence intervals")
    return n_boot


def _resamples(groups: np.ndarray, n_boot: int, seed: int):
    """Yield (sample indices, new group labels) for each bootstrap draw of whole groups."""
    rng = np.random.default_rng(seed)
    n_groups = int(groups.max()) + 1 if len(groups) else 0
    singletons = n_groups == len(groups)
    members = None if singletons else [np.flatnonzero(groups == g) for g in range(n_groups)]
    for _ in range(n_boot):
        draw = rng.integers(0, n_groups, n_groups)
        if singletons:
            yield draw, np.arange(n_groups)
        else:
            # a group drawn twice counts as two groups, hence fresh labels per draw position
            idx = np.concatenate([members[g] for g in draw])
            labels = np.repeat(np.arange(n_groups), [len(members[g]) for g in draw])
            yield idx, labels


def bootstrap_ci(aggregate: Aggregate, columns: dict[str, np.ndarray], groups: np.ndarray,
                 n_boot: int = 1000, seed: int = 0, confidence: float = 0.95) -> dict[str, list[float] | None]:
    """Percentile CI of every aggregate key over resamples of the groups (None for each with n_boot=0)."""
    if check_n_boot(n_boot) == 0:
        return dict.fromkeys(aggregate(columns, groups))
    draws: dict[str, list[float]] = {}
    for idx, labels in _resamples(groups, n_boot, seed):
        for key, value in aggregate({k: v[idx] for k, v in columns.items()}, labels).items():
            draws.setdefault(key, []).append(value)
    tail = (1.0 - confidence) / 2 * 100
    return {k: [float(np.percentile(v, tail)), float(np.percentile(v, 100 - tail))] for k, v in draws.items()}


def paired_bootstrap(aggregate: Aggregate, key: str, cols_a: dict[str, np.ndarray],
                     cols_b: dict[str, np.ndarray], groups: np.ndarray, n_boot: int = 1000,
                     seed: int = 0, confidence: float = 0.95) -> dict[str, float | list[float]]:
    """Delta B - A of one aggregate key on the same samples, with a paired percentile CI.

    Both runs are resampled with the same indices, so per-sample correlation between them
    narrows the interval the way it should. `p_not_better` is the share of draws where B
    does not beat A. With n_boot=0 both are None (no interval).
    """
    point = aggregate(cols_b, groups)[key] - aggregate(cols_a, groups)[key]
    if check_n_boot(n_boot) == 0:
        return {"delta": float(point), "ci": None, "p_not_better": None}
    deltas = []
    for idx, labels in _resamples(groups, n_boot, seed):
        a = aggregate({k: v[idx] for k, v in cols_a.items()}, labels)[key]
        b = aggregate({k: v[idx] for k, v in cols_b.items()}, labels)[key]
        deltas.append(b - a)
    tail = (1.0 - confidence) / 2 * 100
    deltas_arr = np.array(deltas)
    return {
        "delta": float(point),
        "ci": [float(np.percentile(deltas_arr, tail)), float(np.percentile(deltas_arr, 100 - tail))],
        "p_not_better": float((deltas_arr <= 0).mean()),
    }
