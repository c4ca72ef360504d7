"""The serving engine: paged KV cache, scheduler, model runner, OpenAI-compatible server.

`from graft.serving import Engine, EngineConfig, SamplingParams` is the public entry point.
Each name loads on first use (module __getattr__): a command's --help that only needs
EngineConfig's fields (graft.serving.engine.engine_args) does not pay for torch.
"""

from __future__ import annotations

import importlib

# public name -> module that defines it
_LAZY = {
    "EngineConfig": "graft.serving.engine.config",
    "Engine": "graft.serving.engine.engine",
    "EngineStats": "graft.serving.engine.engine",
    "ImageRange": "graft.serving.engine.mm_inputs",
    "MultiModalInputs": "graft.serving.engine.mm_inputs",
    "RequestOutput": "graft.serving.engine.outputs",
    "SamplingParams": "graft.serving.engine.sampling_params",
}

__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later look-ups skip this function
        return value
    raise AttributeError(f"module 'graft.serving' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
