"""Yes/no questions (POPE-style): accuracy, precision, recall, F1 and the share of predicted yes."""

from __future__ import annotations

import re

import numpy as np

from graft.errors import GraftDataError

_WORD = re.compile(r"[a-z']+")


def parse_yes_no(text: str | None) -> bool | None:
    """True for yes, False for no, None when there is no answer at all.

    As in POPE, an answer that says "no" or "not" anywhere is a no; any other non-empty
    answer counts as yes.
    """
    if text is None:
        return None
    words = _WORD.findall(str(text).lower())
    if not words:
        return None
    return not ("no" in words or "not" in words)


def yes_no_scores(predictions, samples) -> list[dict[str, float]]:
    out = []
    for pred, sample in zip(predictions, samples):
        target = parse_yes_no(str(sample.target))
        if str(sample.target).strip().lower() not in ("yes", "no"):
            raise GraftDataError(
                f"sample {sample.id}: yes_no needs the answer 'yes' or 'no', got {sample.target!r}"
            )
        said = parse_yes_no(pred)
        out.append({
            "correct": float(said is not None and said == target),
            "pred_yes": float(said is True),
            "target_yes": float(target),
        })
    return out


def yes_no_aggregate(columns: dict[str, np.ndarray], groups: np.ndarray) -> dict[str, float]:
    pred, gold = columns["pred_yes"], columns["target_yes"]
    tp = float((pred * gold).sum())
    precision = tp / pred.sum() if pred.sum() else 0.0
    recall = tp / gold.sum() if gold.sum() else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "accuracy": float(columns["correct"].mean()),
        "precision": float(precision),
        "recall": float(recall),
        "f1": float(f1),
        "yes_ratio": float(pred.mean()),
    }
