"""VQAv2 soft accuracy, as GT-Vision-Lab's vqaEval.py computes it (lmms-eval's reading selectable).

Source: GT-Vision-Lab/VQA, PythonEvaluationTools/vqaEvaluation/vqaEval.py (commit a013f00),
VQAEval.evaluate: every annotator is left out once and the prediction scores
min(1, matches among the other answers / 3); the score is the mean over the 10 subsets.
Answers are normalized (vqa_answer.py) only when the annotators disagree: with one distinct
human answer the official code compares whitespace-cleaned strings as they are.
Variant "lmms-eval" (lmms_eval/tasks/vqav2/utils.py, vqav2_process_results, commit 75571cf)
always normalizes, so "Two" against ten "2" scores 1 there and 0 in the official code.
lmms-eval before commits b439d82 and 28ea9a1 (July-August 2025) ran its whole
EvalAIAnswerProcessor on the prediction (lowercase, drop "," and "?", "'s" -> " 's") and
normalized the references only when they differed ("Two" against ten "two" scored 0);
scores reported with those versions differ on such cases (tests/evals/test_metrics.py).
"""

from __future__ import annotations

import statistics

import numpy as np

from graft.errors import GraftDataError
from graft.evals.metrics.references import reference_list
from graft.evals.metrics.vqa_answer import clean_whitespace, normalize_answer

DEFINITIONS = {
    "gt-vision-lab": "GT-Vision-Lab/VQA PythonEvaluationTools/vqaEvaluation/vqaEval.py @ a013f00",
    "lmms-eval": "EvolvingLMMs-Lab/lmms-eval lmms_eval/tasks/vqav2/utils.py @ 75571cf",
}


def vqa_soft_accuracy(prediction: str | None, answers: list[str], definition: str = "gt-vision-lab") -> float:
    """Soft accuracy of one prediction against the human answers (usually 10); None scores 0."""
    if definition not in DEFINITIONS:
        raise GraftDataError(f"vqa definition {definition!r} unknown; choose from {sorted(DEFINITIONS)}")
    if prediction is None:  # a failed request: the official code never sees one
        return 0.0
    pred = clean_whitespace(str(prediction))
    gts = [clean_whitespace(str(a)) for a in answers]
    if definition == "lmms-eval" or len(set(gts)) > 1:
        pred = normalize_answer(pred, definition)
        gts = [normalize_answer(a, definition) for a in gts]
    accs = [min(1, float(sum(1 for j, gt in enumerate(gts) if j != i and gt == pred)) / 3)
            for i in range(len(gts))]
    # the official code divides a float sum; lmms-eval takes statistics.mean (exactly rounded)
    return float(statistics.mean(accs)) if definition == "lmms-eval" else float(sum(accs)) / len(accs)


def vqa_scorer(definition: str):
    def vqa_scores(predictions, samples) -> list[dict[str, float]]:
        return [{"vqa_accuracy": vqa_soft_accuracy(pred, reference_list(sample, "vqa_accuracy"), definition)}
                for pred, sample in zip(predictions, samples)]
    return vqa_scores


def vqa_aggregate(columns: dict[str, np.ndarray], groups: np.ndarray) -> dict[str, float]:
    return {"accuracy": float(columns["vqa_accuracy"].mean())}
