"""`pixel_shuffle`: merge r x r neighbouring tokens into one, then an MLP (the Kimi-VL / InternVL shape)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from graft.adapters.base import Projector
from graft.adapters.config import AdapterConfig
from graft.adapters.mlp import MLP
from graft.errors import GraftConfigError


def resolve_grid(n_in: int, grid: tuple[int, int] | None) -> tuple[int, int]:
    """The (h, w) token grid: given, or inferred when n_in is a perfect square."""
    if grid is None:
        side = math.isqrt(n_in)
        if side * side != n_in:
            raise GraftConfigError(
                f"pixel_shuffle needs the token grid: {n_in} tokens is not a square, so pass grid=(h, w) "
                "(encoder.token_grid(width, height)); prefix/CLS tokens must be dropped (encoder.drop_prefix)"
            )
        return side, side
    h, w = (int(g) for g in grid)
    if h * w != n_in:
        raise GraftConfigError(f"pixel_shuffle grid {h}x{w} = {h * w} tokens does not match the {n_in} tokens given")
    return h, w


def pixel_shuffle(x: torch.Tensor, grid: tuple[int, int], r: int) -> torch.Tensor:
    """[h*w, d] -> [ceil(h/r)*ceil(w/r), r*r*d]; odd edges are zero-padded (bottom/right).

    Channel order of a merged token is (row offset, column offset, feature), i.e. index
    (i*r + j)*d + c, the order Kimi-VL's patch merger produces, so its projector weights fit.
    """
    h, w = grid
    d = x.shape[-1]
    x = x.reshape(h, w, d)
    pad_h, pad_w = -h % r, -w % r
    if pad_h or pad_w:
        x = F.pad(x, (0, 0, 0, pad_w, 0, pad_h))
    hh, ww = (h + pad_h) // r, (w + pad_w) // r
    x = x.reshape(hh, r, ww, r, d).permute(0, 2, 1, 3, 4)  # [hh, ww, r, r, d]
    return x.reshape(hh * ww, r * r * d)


class PixelShuffleProjector(Projector):
    """Optional LayerNorm(d_vision) per token, r x r merge, then MLP(r*r*d_vision -> d_model)."""

    def __init__(self, config: AdapterConfig, d_vision: int, d_model: int):
        super().__init__(config, d_vision, d_model)
        self.ratio = config.ratio
        self.norm = nn.LayerNorm(d_vision) if config.layer_norm else None
        merged = config.ratio * config.ratio * d_vision
        self.mlp = MLP(merged, config.hidden_size or d_model, d_model, config.depth)

    def forward(self, x: torch.Tensor, grid: tuple[int, int] | None = None) -> torch.Tensor:
        x = self.check_input(x)  # [h*w, d_vision]
        grid = resolve_grid(x.shape[0], grid)
        if self.norm is not None:
            x = self.norm(x)  # before the merge (and before padding), as Kimi's pre_norm
        return self.mlp(pixel_shuffle(x, grid, self.ratio))  # [ceil(h/r)*ceil(w/r), d_model]

    def num_output_tokens(self, n_in: int, grid: tuple[int, int] | None = None) -> int:
        h, w = resolve_grid(n_in, grid)
        return math.ceil(h / self.ratio) * math.ceil(w / self.ratio)
