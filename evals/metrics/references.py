"""A sample's reference answers as a list of strings, for the metrics that take several."""

from __future__ import annotations

from graft.errors import GraftDataError


def reference_list(sample, metric: str) -> list[str]:
    """The target as a list (a single string is one reference); an empty list is a data error."""
    target = sample.target if isinstance(sample.target, (list, tuple)) else [sample.target]
    if not target:
        raise GraftDataError(f"sample {sample.id}: {metric} needs a non-empty answer list (the task's answer_field)")
    return [str(t) for t in target]
