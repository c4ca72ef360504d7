"""The serving engine: paged KV cache, scheduler, model runner, OpenAI-compatible server.

`from graft.serving import Engine, EngineConfig, SamplingParams` is the public entry point.
The names load on first use (PEP 562), so `graft serve` checks its port and flags before
torch is imported (seconds on a busy machine).
"""

import importlib

_EXPORTS = {
    "EngineConfig": "graft.serving.engine.config",
    "Engine": "graft.serving.engine.engine",
    "EngineStats": "graft.serving.engine.engine",
    "ImageRange": "graft.serving.engine.mm_inputs",
    "MultiModalInputs": "graft.serving.engine.mm_inputs",
    "RequestOutput": "graft.serving.engine.outputs",
    "SamplingParams": "graft.serving.engine.sampling_params",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'graft.serving' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
