"""Normalized exact match: the answer must equal one reference after normalization."""

from __future__ import annotations

import numpy as np

from graft.evals.metrics.normalize import normalize_text


def _references(target) -> list[str]:
    return [str(t) for t in target] if isinstance(target, (list, tuple)) else [str(target)]


def exact_match_scores(predictions, samples) -> list[dict[str, float]]:
    out = []
    for pred, sample in zip(predictions, samples):
        refs = {normalize_text(r) for r in _references(sample.target)}
        hit = pred is not None and normalize_text(pred) in refs
        out.append({"exact_match": float(hit)})
    return out


def exact_match_aggregate(columns: dict[str, np.ndarray], groups: np.ndarray) -> dict[str, float]:
    return {"accuracy": float(columns["exact_match"].mean())}


def identical_scores(predictions, samples) -> list[dict[str, float]]:
    """Strict equality (surrounding whitespace aside): for regressions, where any change counts."""
    return [{"identical": float(p is not None and p.strip() == str(s.target).strip())}
            for p, s in zip(predictions, samples)]


def identical_aggregate(columns: dict[str, np.ndarray], groups: np.ndarray) -> dict[str, float]:
    return {"accuracy": float(columns["identical"].mean())}
