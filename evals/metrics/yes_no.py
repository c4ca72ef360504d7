"""Yes/no questions (POPE): accuracy, precision, recall, F1 and the share of yes.

Source: AoiDragon/POPE, evaluate.py (commit 08d957b). An answer is cut at its first "."
(only the first sentence counts), commas are deleted, and it is split on single spaces; it
is a no when one of those pieces is exactly "No", "no" or "not", and a yes otherwise, so an
empty answer, "NO" or "no!" all count as yes. The label is no when it is "no", else yes.
Where the official script divides by zero (no predicted yes, or no yes label) we report 0.
A failed request (no text at all; the official scripts never see one) is neither yes nor no:
it is wrong, never a predicted yes, and a yes-question that failed counts as missed in recall.
Variant "lmms-eval" (lmms_eval/tasks/pope/utils.py, commit 75571cf): the answer, lowercased
and stripped, must be exactly "yes" or "no"; recall leaves out yes-questions answered
neither; its yes_ratio is the share of yes *labels*, as that code computes it.
"""

from __future__ import annotations

import numpy as np

from graft.errors import GraftDataError

DEFINITIONS = {
    "pope": "AoiDragon/POPE evaluate.py @ 08d957b",
    "lmms-eval": "EvolvingLMMs-Lab/lmms-eval lmms_eval/tasks/pope/utils.py @ 75571cf",
}
_NO_WORDS = ("No", "not", "no")


def parse_yes_no(text: str | None) -> bool:
    """True for yes, False for no, by the official script's rules."""
    text = "" if text is None else str(text)
    if text.find(".") != -1:
        text = text.split(".")[0]
    words = text.replace(",", "").split(" ")
    return not any(w in words for w in _NO_WORDS)


def _label(sample) -> bool:
    label = str(sample.target).strip().lower()
    if label not in ("yes", "no"):
        raise GraftDataError(f"sample {sample.id}: yes_no needs the answer 'yes' or 'no', got {sample.target!r}")
    return label == "yes"


def yes_no_scorer(definition: str):
    def yes_no_scores(predictions, samples) -> list[dict[str, float]]:
        out = []
        for pred, sample in zip(predictions, samples):
            target = _label(sample)
            if pred is None:  # parsing "" would make it a yes, and right on every yes-question
                said_yes = said_no = False
            elif definition == "pope":
                said_yes = parse_yes_no(pred)
                said_no = not said_yes
            else:
                said = str(pred).lower().strip()
                said_yes, said_no = said == "yes", said == "no"
            out.append({"correct": float(said_yes if target else said_no), "pred_yes": float(said_yes),
                        "pred_no": float(said_no), "target_yes": float(target),
                        "failed": float(pred is None)})
        return out
    return yes_no_scores


def _ratio(num: float, den: float) -> float:
    return num / den if den else 0.0


def yes_no_aggregator(definition: str):
    def yes_no_aggregate(columns: dict[str, np.ndarray], groups: np.ndarray) -> dict[str, float]:
        pred, gold = columns["pred_yes"], columns["target_yes"]
        no = columns.get("pred_no", 1.0 - pred)  # samples files written before pred_no existed
        failed = columns.get("failed", np.zeros_like(pred))  # ... and before failed existed
        tp = float((pred * gold).sum())
        precision = _ratio(tp, float(pred.sum()))
        recall = _ratio(tp, tp + float(((no + failed) * gold).sum()))
        return {
            "accuracy": float(columns["correct"].mean()),
            "precision": precision,
            "recall": recall,
            "f1": _ratio(2 * precision * recall, precision + recall),
            "yes_ratio": float((pred if definition == "pope" else gold).mean()),
        }
    return yes_no_aggregate
