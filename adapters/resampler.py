"""`resampler`: K learned queries cross-attend to the image tokens; always K output tokens."""

from __future__ import annotations

import math

import torch
from torch import nn

from graft.adapters.base import Projector
from graft.adapters.config import AdapterConfig
from graft.adapters.pixel_shuffle import resolve_grid
from graft.errors import GraftConfigError


def sincos_2d(grid: tuple[int, int], dim: int) -> torch.Tensor:
    """Fixed 2D sin-cos position codes [h*w, dim]: half the dims encode the row, half the column."""
    h, w = grid
    quarter = dim // 4
    freqs = 1.0 / (10000 ** (torch.arange(quarter, dtype=torch.float32) / max(quarter, 1)))
    rows = torch.arange(h, dtype=torch.float32)[:, None].expand(h, w).reshape(-1, 1) * freqs  # [h*w, quarter]
    cols = torch.arange(w, dtype=torch.float32)[None, :].expand(h, w).reshape(-1, 1) * freqs
    pos = torch.cat([rows.sin(), rows.cos(), cols.sin(), cols.cos()], dim=1)  # [h*w, 4*quarter]
    return nn.functional.pad(pos, (0, dim - pos.shape[1]))  # widths not divisible by 4: zero tail


class ResamplerProjector(Projector):
    """Perceiver-style: keys/values = LayerNorm(Linear(x)) + 2D position codes, queries learned."""

    def __init__(self, config: AdapterConfig, d_vision: int, d_model: int):
        super().__init__(config, d_vision, d_model)
        if d_model % config.num_heads:
            raise GraftConfigError(
                f"adapter.num_heads={config.num_heads} must divide d_model={d_model}; pick a divisor of {d_model}"
            )
        self.in_norm = nn.LayerNorm(d_vision) if config.layer_norm else None
        self.kv_proj = nn.Linear(d_vision, d_model)
        self.kv_norm = nn.LayerNorm(d_model)
        self.queries = nn.Parameter(torch.empty(config.num_queries, d_model))
        nn.init.trunc_normal_(self.queries, std=0.02)
        self.q_norm = nn.LayerNorm(d_model)
        self.attn = nn.MultiheadAttention(d_model, config.num_heads, batch_first=True)
        self.out_norm = nn.LayerNorm(d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, grid: tuple[int, int] | None = None) -> torch.Tensor:
        x = self.check_input(x)  # [n, d_vision]
        if grid is None and math.isqrt(x.shape[0]) ** 2 != x.shape[0]:
            grid = (1, x.shape[0])  # no 2D layout known: position codes along the sequence
        grid = resolve_grid(x.shape[0], grid)
        if self.in_norm is not None:
            x = self.in_norm(x)
        kv = self.kv_norm(self.kv_proj(x))  # [n, d_model]
        keys = kv + sincos_2d(grid, self.d_model).to(kv)
        q = self.q_norm(self.queries)  # [K, d_model]
        out, _ = self.attn(q[None], keys[None], kv[None], need_weights=False)  # [1, K, d_model]
        return self.out_proj(self.out_norm(out[0]))  # [K, d_model]

    def num_output_tokens(self, n_in: int, grid: tuple[int, int] | None = None) -> int:
        return self.config.num_queries
