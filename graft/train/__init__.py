"""Training: LLaVA-style data, batching, the feature cache, the loop and its checkpoints.

`graft.train.train(spec)` trains a GraftSpec and returns the run dir.
"""

from graft.lazy_exports import lazy_exports

# loaded on first use: `graft train --help` (graft.train.cli) then needs no torch
__getattr__, __dir__ = lazy_exports(__name__, {"train": "graft.train.loop"})
__all__ = ["train"]
