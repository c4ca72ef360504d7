"""ANLS (average normalized Levenshtein similarity, threshold 0.5) for text-in-image answers.

Source: EvolvingLMMs-Lab/lmms-eval, lmms_eval/api/metrics.py, `anls` (commit 75571cf; it
follows Qwen-VL's eval_mm/infographicsvqa_eval.py). Per question: the distance is taken
between the lowercased, whitespace-collapsed strings but divided by the longer of the *raw*
strings' lengths (as `len(s.upper())`, which counts "ß" as 2); the score is 1 - the smallest
normalized distance over the answers, set to 0 when below 0.5 (so exactly 0.5 is kept).
"""

from __future__ import annotations

import numpy as np

from graft.errors import GraftDataError
from graft.evals.metrics.references import reference_list

THRESHOLD = 0.5
DEFINITION = "EvolvingLMMs-Lab/lmms-eval lmms_eval/api/metrics.py anls @ 75571cf"


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


def _collapse(text: str) -> str:
    return " ".join(text.strip().lower().split())


def anls_score(prediction: str | None, answers: list[str], threshold: float = THRESHOLD) -> float:
    """1 - min over answers of the normalized distance, 0 below the threshold; None scores 0."""
    if prediction is None:  # a failed request: the reference code never sees one
        return 0.0
    if not answers:
        raise GraftDataError("anls needs at least one answer per sample")
    pred = str(prediction)
    distances = []
    for answer in map(str, answers):
        length = max(len(answer.upper()), len(pred.upper()))
        dist = levenshtein(_collapse(answer), _collapse(pred))
        distances.append(0.0 if length == 0 else float(dist) / float(length))
    score = 1 - min(distances)
    return 0.0 if score < threshold else score


def anls_scores(predictions, samples) -> list[dict[str, float]]:
    return [{"anls": anls_score(pred, reference_list(sample, "anls"))} for pred, sample in zip(predictions, samples)]


def anls_aggregate(columns: dict[str, np.ndarray], groups: np.ndarray) -> dict[str, float]:
    return {"anls": float(columns["anls"].mean())}
