"""Eval harness: tasks, metrics, backends, reports, benchmarks.

`run_eval(model_or_backend, tasks=[...], data_root=..., out_dir=..., limit=None) -> dict`.
"""

from graft.evals.compare import compare_runs
from graft.evals.runner import run_eval
from graft.evals.task import get_task, list_tasks

__all__ = ["compare_runs", "get_task", "list_tasks", "run_eval"]
