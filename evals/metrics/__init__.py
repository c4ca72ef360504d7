"""Metric registry: name -> per-sample scorer and aggregation over the whole sample list."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from graft.evals.metrics.anls import anls_aggregate, anls_scores
from graft.evals.metrics.cider import cider_aggregate, cider_scores
from graft.evals.metrics.exact_match import (
    exact_match_aggregate,
    exact_match_scores,
    identical_aggregate,
    identical_scores,
)
from graft.evals.metrics.multiple_choice import mc_aggregate, mc_scores
from graft.evals.metrics.vqa import vqa_aggregate, vqa_scores
from graft.evals.metrics.yes_no import yes_no_aggregate, yes_no_scores


@dataclass(frozen=True)
class Metric:
    name: str
    primary: str  # the aggregate key reported as the task's headline score
    # (predictions, samples) -> one dict of floats per sample; may look at the whole corpus
    score: Callable
    # (columns: key -> float array over samples, groups: int array) -> aggregate scores;
    # called again on every bootstrap resample
    aggregate: Callable


METRICS: dict[str, Metric] = {
    "exact_match": Metric("exact_match", "accuracy", exact_match_scores, exact_match_aggregate),
    "identical": Metric("identical", "accuracy", identical_scores, identical_aggregate),
    "vqa_accuracy": Metric("vqa_accuracy", "accuracy", vqa_scores, vqa_aggregate),
    "multiple_choice": Metric("multiple_choice", "accuracy", mc_scores, mc_aggregate),
    "circular_choice": Metric("circular_choice", "circular_accuracy", mc_scores, mc_aggregate),
    "yes_no": Metric("yes_no", "f1", yes_no_scores, yes_no_aggregate),
    "anls": Metric("anls", "anls", anls_scores, anls_aggregate),
    "cider_d": Metric("cider_d", "cider_d", cider_scores, cider_aggregate),
}

__all__ = ["METRICS", "Metric"]
