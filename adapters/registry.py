"""kind -> projector class, and build_adapter with a seeded, reproducible init."""

from __future__ import annotations

from typing import Any

import torch

from graft.adapters.base import Projector
from graft.adapters.config import AdapterConfig
from graft.adapters.mlp import LinearProjector, MLPProjector
from graft.adapters.pixel_shuffle import PixelShuffleProjector
from graft.adapters.resampler import ResamplerProjector

ADAPTERS: dict[str, type[Projector]] = {
    "linear": LinearProjector,
    "mlp": MLPProjector,
    "pixel_shuffle": PixelShuffleProjector,
    "resampler": ResamplerProjector,
}


def build_adapter(config: AdapterConfig | dict[str, Any], d_vision: int, d_model: int) -> Projector:
    """A fresh projector d_vision -> d_model in fp32 on CPU; the same seed gives the same weights."""
    cfg = config if isinstance(config, AdapterConfig) else AdapterConfig.from_dict(config)
    cfg.validate()
    # Seeded in a forked RNG: neither depends on nor disturbs the caller's global RNG state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        return ADAPTERS[cfg.kind](cfg, d_vision, d_model)
