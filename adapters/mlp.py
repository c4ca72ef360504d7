"""Token-wise projectors: `linear` (one Linear) and `mlp` (depth N, GELU between; LLaVA-1.5 = 2)."""

from __future__ import annotations

import torch
from torch import nn

from graft.adapters.base import Projector
from graft.adapters.config import AdapterConfig
from graft.errors import GraftConfigError


class ChunkedLayerNorm(nn.LayerNorm):
    """LayerNorm over each of `chunks` equal slices of the last dim (Kimi normalizes each of the
    4 sub-patches of a 2x2-merged token separately; chunks=1 is a plain LayerNorm)."""

    def __init__(self, dim: int, chunks: int = 1):
        if dim % chunks:
            raise GraftConfigError(f"adapter.norm_chunks={chunks} must divide the input width {dim}")
        super().__init__(dim // chunks)
        self.chunks = chunks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        return super().forward(x.reshape(*shape[:-1], self.chunks, -1)).reshape(shape)


class MLP(nn.Module):
    """Linear (-> GELU -> Linear) * (depth - 1); keys `linears.{i}.weight`."""

    def __init__(self, d_in: int, hidden: int, d_out: int, depth: int):
        super().__init__()
        widths = [d_in] + [hidden] * (depth - 1) + [d_out]
        self.linears = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:]))
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, linear in enumerate(self.linears):
            x = linear(x if i == 0 else self.act(x))
        return x


class MLPProjector(Projector):
    """Optional pre-norm, then an MLP applied to every token; the token count is unchanged."""

    def __init__(self, config: AdapterConfig, d_vision: int, d_model: int):
        super().__init__(config, d_vision, d_model)
        depth = 1 if config.kind == "linear" else config.depth
        self.norm = ChunkedLayerNorm(d_vision, config.norm_chunks) if config.layer_norm else None
        self.mlp = MLP(d_vision, config.hidden_size or d_model, d_model, depth)

    def forward(self, x: torch.Tensor, grid: tuple[int, int] | None = None) -> torch.Tensor:
        x = self.check_input(x)  # [n, d_vision]
        if self.norm is not None:
            x = self.norm(x)
        return self.mlp(x)  # [n, d_model]


class LinearProjector(MLPProjector):
    """A single Linear d_vision -> d_model (with the optional pre-norm)."""
