"""`graft quantize`: per-group weight precision for the frozen LLM, found by measuring whole
configurations end to end on graft's engine (docs/quant-search.md).

Imports of graft.serving and graft.evals stay inside functions: they depend on graft core.
"""

from graft.quantize.evaluator import EvalSettings
from graft.quantize.pareto import Goal, pareto_front
from graft.quantize.run import quantize_search

__all__ = ["EvalSettings", "Goal", "pareto_front", "quantize_search"]
