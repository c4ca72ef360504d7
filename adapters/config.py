"""AdapterConfig: which projector to build between encoder features and LLM embeddings (torch-free)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from graft.errors import GraftConfigError, check_fields

KINDS = ("linear", "mlp", "pixel_shuffle", "resampler")


@dataclass
class AdapterConfig:
    """The `adapter:` block of a graft spec; every field has a default."""

    kind: str = "mlp"  # linear | mlp | pixel_shuffle | resampler
    depth: int = 2  # mlp / pixel_shuffle: number of Linear layers, GELU between (LLaVA-1.5 = 2)
    hidden_size: int | None = None  # inner width of the MLP (default d_model; Kimi's projector uses ratio^2 * d_vision)
    ratio: int = 2  # pixel_shuffle: merge r x r neighbouring tokens into one (odd grids are zero-padded)
    num_queries: int = 64  # resampler: K learned queries = fixed output token count
    num_heads: int = 8  # resampler: cross-attention heads (must divide d_model)
    layer_norm: bool = False  # pre-norm: LayerNorm on the input features before the first Linear (Kimi's pre_norm)
    norm_chunks: int = 1  # linear/mlp: normalize each of this many equal chunks of an input row separately (Kimi on 2x2-merged tokens: 4)
    standardize: bool = False  # subtract each feature channel's training-set mean, divide by its std (stats fixed before step 1, saved with the adapter)
    seed: int = 0  # init seed: the same seed gives the same initial weights

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "AdapterConfig":
        """Build from a spec mapping; unknown keys or wrong types raise GraftConfigError."""
        if d is None:
            return cls()
        if isinstance(d, cls):
            return d
        d = check_fields(cls, d, "adapter")
        cfg = cls(**d)
        cfg.validate()
        return cfg

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def validate(self) -> None:
        if self.kind not in KINDS:
            raise GraftConfigError(f"unknown adapter.kind {self.kind!r}; known kinds: {', '.join(KINDS)}")
        for name in ("depth", "ratio", "num_queries", "num_heads", "norm_chunks", "seed"):
            _check_int(getattr(self, name), f"adapter.{name}", minimum=0 if name == "seed" else 1)
        if self.hidden_size is not None:
            _check_int(self.hidden_size, "adapter.hidden_size", minimum=1)
        for name in ("layer_norm", "standardize"):
            if not isinstance(getattr(self, name), bool):
                raise GraftConfigError(f"adapter.{name} must be true or false, got {getattr(self, name)!r}")


def _check_int(value: Any, name: str, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise GraftConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
