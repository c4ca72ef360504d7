"""Multiple choice (MMBench): VLMEvalKit's answer-letter matching and circular evaluation.

Source: open-compass/VLMEvalKit, vlmeval/utils/matching_util.py (commit e8e78f0):
can_infer = can_infer_option, else can_infer_text, with VERBOSE unset and no LLM judge
(VLMEvalKit's `exact_matching`). "Z" is its answer for refusals; it is never right.
Circular evaluation (vlmeval/dataset/utils/multiple_choice.py, mcq_circular_eval): a question
is right only if every rotation of its options is; plain accuracy counts the first pass only.
"""

from __future__ import annotations

import re

import numpy as np

from graft.errors import GraftDataError

DEFINITION = "open-compass/VLMEvalKit vlmeval/utils/matching_util.py can_infer @ e8e78f0"
_REFUSALS = ("Sorry, I can't help with images of people yet.", "I can't process this file.",
             "I'm sorry, but without the image provided", "Cannot determine the answer")
_VERBOSE_ANSWER = re.compile(r"(?i)(?:correct\s+)?answer\s+is\s+\**([ABCD])\**")
_SPLIT_CHARS = str.maketrans({c: " " for c in ".()[],:;!*#{}"})


def _infer_option(answer: str, letters: list[str]) -> str | None:
    if "Failed to obtain answer via API" in answer:
        return None
    if any(r in answer for r in _REFUSALS):
        return "Z"
    splits = answer.translate(_SPLIT_CHARS).split()
    named = [c for c in letters if c in splits]
    # one letter named, and within the last five words (else "A" may be an article early on)
    if len(named) == 1 and splits.index(named[0]) > len(splits) - 5:
        return named[0]
    if not named and "Z" in splits:
        return "Z"
    verbose = _VERBOSE_ANSWER.search(answer)
    if verbose and verbose.group(1).upper() in letters:
        return verbose.group(1).upper()
    return None


def _infer_text(answer: str, options: dict[str, str]) -> str | None:
    answer = answer.lower()
    if len(answer) > 2 * sum(len(str(v)) for v in options.values()):
        return None
    hits = [k for k, v in options.items() if str(v).lower() in answer]
    return hits[0] if len(hits) == 1 else None


def extract_choice(prediction: str | None, options: dict[str, str]) -> str | None:
    """The letter VLMEvalKit's can_infer reads from an answer ("Z" for a refusal), or None."""
    if prediction is None:
        return None
    answer = str(prediction)
    return _infer_option(answer, list(options)) or _infer_text(answer, options)


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
        out.append({"correct": float(choice == str(sample.target)), "extracted": float(choice not in (None, "Z")),
                    "first_pass": float(sample.rotation == 0)})
    return out


def mc_aggregate(columns: dict[str, np.ndarray], groups: np.ndarray) -> dict[str, float]:
    correct = columns["correct"]
    # samples files written before first_pass existed: every row counts
    first = columns.get("first_pass", np.ones_like(correct)).astype(bool)
    # a group (one question, all its rotations) is right only if its worst rotation is right
    order = np.argsort(groups, kind="stable")
    sorted_groups = groups[order]
    starts = np.flatnonzero(np.r_[True, sorted_groups[1:] != sorted_groups[:-1]])
    per_group = np.minimum.reduceat(correct[order], starts) if len(order) else np.zeros(0)
    return {
        "accuracy": float(correct[first].mean()) if first.any() else 0.0,
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
