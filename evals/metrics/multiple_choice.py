"""Multiple choice (MMBench-style): option-letter extraction and circular evaluation.

With circular evaluation each question is asked once per rotation of its options and
counts as right only if every rotation is answered right.
"""

from __future__ import annotations

import re

import numpy as np

from graft.errors import GraftDataError
from graft.evals.metrics.normalize import normalize_text

_LEADING = re.compile(r"^\s*(?:answer\s*(?:is)?\s*[:\-]?\s*)?[\(\[]?([A-Z])(?:[\)\]\.:,]|$)")
# "A" followed by a lowercase word is the article, not option A
_STANDALONE = re.compile(r"\b([A-Z])\b(?<!\bA)|\bA\b(?!\s+(?!or\b|and\b)[a-z])")


def extract_choice(prediction: str | None, options: dict[str, str]) -> str | None:
    """The option letter a free-form answer picks, or None when it picks none or several."""
    if prediction is None:
        return None
    text = str(prediction).strip()
    letters = list(options)
    lead = _LEADING.match(text) or _LEADING.match(text.upper())
    if lead and lead.group(1) in letters:
        return lead.group(1)
    norm = normalize_text(text)
    by_text = [k for k, v in options.items() if normalize_text(v) == norm]
    if len(by_text) == 1:
        return by_text[0]
    standalone = {m.group(1) or "A" for m in _STANDALONE.finditer(text)} & set(letters)
    if len(standalone) == 1:
        return standalone.pop()
    contained = [k for k, v in options.items() if normalize_text(v) and f" {normalize_text(v)} " in f" {norm} "]
    if len(contained) == 1:
        return contained[0]
    return None


def mc_scores(predictions, samples) -> list[dict[str, float]]:
    out = []
    for pred, sample in zip(predictions, samples):
        if not sample.options:
            raise GraftDataError(f"sample {sample.id}: multiple_choice needs 'options'")
        if str(sample.target) not in sample.options:
            raise GraftDataError(
                f"sample {sample.id}: answer {sample.target!r} is not one of the option letters "
                f"{sorted(sample.options)}"
            )
        choice = extract_choice(pred, sample.options)
        out.append({"correct": float(choice == str(sample.target)), "extracted": float(choice is not None)})
    return out


def mc_aggregate(columns: dict[str, np.ndarray], groups: np.ndarray) -> dict[str, float]:
    correct = columns["correct"]
    # a group (one question, all its rotations) is right only if its worst rotation is right
    order = np.argsort(groups, kind="stable")
    sorted_groups = groups[order]
    starts = np.flatnonzero(np.r_[True, sorted_groups[1:] != sorted_groups[:-1]])
    per_group = np.minimum.reduceat(correct[order], starts) if len(order) else np.zeros(0)
    return {
        "accuracy": float(correct.mean()),
        "circular_accuracy": float(per_group.mean()) if len(per_group) else 0.0,
        "extracted": float(columns["extracted"].mean()),
    }


def rotate_options(options: dict[str, str], answer: str, shift: int) -> tuple[dict[str, str], str]:
    """Options shifted by `shift` positions under the same letters, and the answer's new letter."""
    letters = list(options)
    texts = [options[k] for k in letters]
    k = shift % len(texts)
    rotated = texts[k:] + texts[:k]
    new_answer = letters[(letters.index(answer) - k) % len(letters)]
    return dict(zip(letters, rotated)), new_answer
