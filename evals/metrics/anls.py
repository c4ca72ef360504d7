"""ANLS (average normalized Levenshtein similarity, tau = 0.5) for text-in-image answers."""

from __future__ import annotations

import numpy as np

TAU = 0.5


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insert, delete, substitute all cost 1)."""
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def anls_score(prediction: str | None, answers: list[str], tau: float = TAU) -> float:
    """max over answers of 1 - NL, where a normalized distance NL >= tau scores 0."""
    if prediction is None:
        return 0.0
    pred = " ".join(str(prediction).lower().split())
    best = 0.0
    for ans in answers:
        gt = " ".join(str(ans).lower().split())
        longest = max(len(pred), len(gt))
        nl = levenshtein(pred, gt) / longest if longest else 0.0
        best = max(best, 1.0 - nl if nl < tau else 0.0)
    return best


def anls_scores(predictions, samples) -> list[dict[str, float]]:
    out = []
    for pred, sample in zip(predictions, samples):
        answers = sample.target if isinstance(sample.target, (list, tuple)) else [sample.target]
        out.append({"anls": anls_score(pred, list(answers))})
    return out


def anls_aggregate(columns: dict[str, np.ndarray], groups: np.ndarray) -> dict[str, float]:
    return {"anls": float(columns["anls"].mean())}
