"""Metric registry: name -> per-sample scorer, aggregation, and the official evaluator it follows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from graft.evals.metrics import anls, cider, multiple_choice, vqa, yes_no
from graft.evals.metrics.exact_match import (
    exact_match_aggregate,
    exact_match_scores,
    identical_aggregate,
    identical_scores,
)


@dataclass(frozen=True)
class Metric:
    name: str
    primary: str  # the aggregate key reported as the task's headline score
    # (predictions, samples) -> one dict of floats per sample; may look at the whole corpus
    score: Callable
    # (columns: key -> float array over samples, groups: int array) -> aggregate scores;
    # called again on every bootstrap resample
    aggregate: Callable
    definition: str  # which evaluator's code the score reproduces (recorded in results.json)


_GRAFT = "graft (no official evaluator)"
METRICS: dict[str, Metric] = {m.name: m for m in [
    Metric("exact_match", "accuracy", exact_match_scores, exact_match_aggregate, _GRAFT),
    Metric("identical", "accuracy", identical_scores, identical_aggregate, _GRAFT),
    Metric("vqa_accuracy", "accuracy", vqa.vqa_scorer("gt-vision-lab"), vqa.vqa_aggregate,
           vqa.DEFINITIONS["gt-vision-lab"]),
    Metric("vqa_accuracy_lmms_eval", "accuracy", vqa.vqa_scorer("lmms-eval"), vqa.vqa_aggregate,
           vqa.DEFINITIONS["lmms-eval"]),
    Metric("multiple_choice", "accuracy", multiple_choice.mc_scores, multiple_choice.mc_aggregate,
           multiple_choice.DEFINITION),
    Metric("circular_choice", "circular_accuracy", multiple_choice.mc_scores, multiple_choice.mc_aggregate,
           multiple_choice.DEFINITION),
    Metric("yes_no", "f1", yes_no.yes_no_scorer("pope"), yes_no.yes_no_aggregator("pope"),
           yes_no.DEFINITIONS["pope"]),
    Metric("yes_no_lmms_eval", "f1", yes_no.yes_no_scorer("lmms-eval"), yes_no.yes_no_aggregator("lmms-eval"),
           yes_no.DEFINITIONS["lmms-eval"]),
    Metric("anls", "anls", anls.anls_scores, anls.anls_aggregate, anls.DEFINITION),
    Metric("cider_d", "cider_d", cider.cider_scores, cider.cider_aggregate, cider.DEFINITION),
]}

__all__ = ["METRICS", "Metric"]
