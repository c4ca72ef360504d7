"""VQAv2 soft accuracy: mean over the 10 leave-one-out subsets of min(1, matches / 3)."""

from __future__ import annotations

import numpy as np

from graft.errors import GraftDataError
from graft.evals.metrics.normalize import normalize_vqa


def vqa_soft_accuracy(prediction: str | None, answers: list[str]) -> float:
    """Soft accuracy of one prediction against the human answers (usually 10).

    Every annotator is left out once; the prediction scores min(1, hits among the other
    answers / 3) for that subset, and the result is the mean over subsets.
    """
    if prediction is None:
        return 0.0
    pred = normalize_vqa(prediction)
    gts = [normalize_vqa(a) for a in answers]
    total = 0.0
    for i in range(len(gts)):
        hits = sum(1 for j, gt in enumerate(gts) if j != i and gt == pred)
        total += min(1.0, hits / 3.0)
    return total / len(gts)


def vqa_scores(predictions, samples) -> list[dict[str, float]]:
    out = []
    for pred, sample in zip(predictions, samples):
        answers = sample.target if isinstance(sample.target, (list, tuple)) else [sample.target]
        if not answers:
            raise GraftDataError(f"sample {sample.id}: vqa_accuracy needs a non-empty answer list")
        out.append({"vqa_accuracy": vqa_soft_accuracy(pred, [str(a) for a in answers])})
    return out


def vqa_aggregate(columns: dict[str, np.ndarray], groups: np.ndarray) -> dict[str, float]:
    return {"accuracy": float(columns["vqa_accuracy"].mean())}
