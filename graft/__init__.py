"""graft: join a vision encoder to a frozen LLM through a trainable projector.

Kept import-light on purpose: subpackages (graft.kernels, graft.encoders, ...) import
`graft` first, so nothing heavy may load here. The main classes are still one import away
(`from graft import GraftedModel, Engine`): each loads on first use (module __getattr__).
"""

from __future__ import annotations

from graft.lazy_exports import lazy_exports

__version__ = "0.1.0"

# public name -> module that defines it
_LAZY = {
    "GraftSpec": "graft.spec",
    "GraftedModel": "graft.model",
    "RunDir": "graft.run_dir",
    "GraftError": "graft.errors",
    "GraftConfigError": "graft.errors",
    "GraftDataError": "graft.errors",
    "Engine": "graft.serving",
    "EngineConfig": "graft.serving",
    "SamplingParams": "graft.serving",
}

__all__ = ["__version__", *_LAZY]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
