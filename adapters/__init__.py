"""Trainable projectors from encoder features to LLM embeddings.

`build_adapter(AdapterConfig(kind=...), d_vision, d_model)`; kinds: linear, mlp, pixel_shuffle,
resampler. AdapterConfig is torch-free; the rest loads torch on first touch.
"""

from graft.adapters.config import KINDS, AdapterConfig

_LAZY = {
    "ADAPTERS": "graft.adapters.registry",
    "build_adapter": "graft.adapters.registry",
    "save_adapter": "graft.adapters.checkpoint",
    "load_adapter": "graft.adapters.checkpoint",
    "Projector": "graft.adapters.base",
    "LinearProjector": "graft.adapters.mlp",
    "MLPProjector": "graft.adapters.mlp",
    "PixelShuffleProjector": "graft.adapters.pixel_shuffle",
    "ResamplerProjector": "graft.adapters.resampler",
}

__all__ = ["AdapterConfig", "KINDS", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'graft.adapters' has no attribute {name!r}")
