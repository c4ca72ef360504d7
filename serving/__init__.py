"""The serving engine: paged KV cache, scheduler, model runner, OpenAI-compatible server.

`from graft.serving import Engine, EngineConfig, SamplingParams` (and PoolingParams for
embeddings) is the public entry point.
Each name loads on first use (module __getattr__): a command's --help that only needs
EngineConfig's fields (graft.serving.engine.engine_args) does not pay for torch, and
`graft serve` checks its port and flags before torch is imported.
"""

from __future__ import annotations

from graft.lazy_exports import lazy_exports

# public name -> module that defines it
_LAZY = {
    "EngineConfig": "graft.serving.engine.config",
    "Engine": "graft.serving.engine.engine",
    "EngineStats": "graft.serving.engine.engine",
    "ImageRange": "graft.serving.engine.mm_inputs",
    "MultiModalInputs": "graft.serving.engine.mm_inputs",
    "PoolingParams": "graft.serving.engine.pooling",
    "RequestOutput": "graft.serving.engine.outputs",
    "SamplingParams": "graft.serving.engine.sampling_params",
}

__all__ = list(_LAZY)


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
