"""What every projector shares: dims, input checks, the per-image call contract."""

from __future__ import annotations

import torch
from torch import nn

from graft.adapters.config import AdapterConfig
from graft.errors import GraftConfigError

STD_EPS = 1e-5  # adapter.standardize: keeps channels that never vary (std 0) finite


class Projector(nn.Module):
    """Maps one image's features [n_in, d_vision] to [n_out, d_model] LLM embeddings."""

    def __init__(self, config: AdapterConfig, d_vision: int, d_model: int):
        super().__init__()
        for name, value in (("d_vision", d_vision), ("d_model", d_model)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise GraftConfigError(f"adapter {name} must be a positive integer, got {value!r}")
        self.config = config
        self.d_vision = d_vision
        self.d_model = d_model
        if config.standardize:
            # identity until set_feature_stats (graft train does it before step 1); buffers,
            # so they are saved and loaded with the adapter but never trained
            self.register_buffer("feature_mean", torch.zeros(d_vision))
            self.register_buffer("feature_std", torch.ones(d_vision))

    def set_feature_stats(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        """Fix the per-channel statistics that adapter.standardize divides out."""
        if not self.config.standardize:
            raise GraftConfigError("set_feature_stats: this adapter was built without adapter.standardize")
        for name, t in (("mean", mean), ("std", std)):
            if tuple(t.shape) != (self.d_vision,) or not bool(torch.isfinite(t).all()):
                raise GraftConfigError(f"set_feature_stats: {name} must be {self.d_vision} finite values, "
                                       f"got shape {tuple(t.shape)}")
        self.feature_mean.copy_(mean)
        self.feature_std.copy_(std)

    def check_input(self, x: torch.Tensor) -> torch.Tensor:
        """x as [n_in, d_vision] in the projector's dtype (standardized first with
        adapter.standardize), or GraftConfigError naming the dims."""
        if not isinstance(x, torch.Tensor) or x.ndim != 2:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise GraftConfigError(f"{self.config.kind} projector takes one image's features [n_tokens, {self.d_vision}], got {shape}")
        if x.shape[-1] != self.d_vision:
            raise GraftConfigError(
                f"{self.config.kind} projector was built for d_vision={self.d_vision} but got features of width "
                f"{x.shape[-1]} (shape {tuple(x.shape)}): the encoder's hidden_size does not match the adapter; "
                "rebuild the adapter for this encoder"
            )
        if self.config.standardize:  # in fp32, before the cast: the stats are fp32
            x = (x.float() - self.feature_mean) / (self.feature_std + STD_EPS)
        # Encoders emit fp32 by default; follow the projector's own dtype (bf16 training).
        return x.to(next(self.parameters()).dtype)

    def num_output_tokens(self, n_in: int, grid: tuple[int, int] | None = None) -> int:
        return n_in

    def extra_repr(self) -> str:
        return f"d_vision={self.d_vision}, d_model={self.d_model}"
