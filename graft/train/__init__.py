"""Training: LLaVA-style data, batching, the feature cache, the loop and its checkpoints.

`graft.train.train(spec)` trains a GraftSpec and returns the run dir.
"""

from graft.train.loop import train

__all__ = ["train"]
