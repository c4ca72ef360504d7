"""EncoderConfig: which vision encoder to build and how to select its features (torch-free)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

from graft.errors import GraftConfigError, check_fields


@dataclass
class EncoderConfig:
    """The `encoder:` block of a graft spec; every field has a default."""

    kind: str = "timm"  # registry name: timm | siglip | clip | moonvit
    path: str | None = None  # local dir (HF towers) or weights file (timm: .safetensors/.pth); None = random init (timm only)
    model_name: str | None = None  # timm model name (e.g. efficientnet_lite0, vit_base_patch16_224)
    feature_layer: int = -2  # hidden_states index as in HF: -1 last block, -2 penultimate, k>0 after block k; CNNs: last feature map
    drop_prefix: bool = True  # drop CLS/register/prefix tokens (CLIP drops CLS; SigLIP has none)
    image_size: int | None = None  # override the square input resolution where the model allows (ViT pos-embed resampled)
    timm_kwargs: dict = field(default_factory=dict)  # extra kwargs for timm.create_model (tests build tiny ViTs; bn_eps, ...)
    max_image_tokens: int | None = None  # native-resolution encoders only (moonvit); others ignore it
    cnn_stage: int | list[int] | None = None  # timm CNNs: feature stage to use (feature_info index, negative from the end), or a list of stages merged on the coarsest grid; None = last map after the head conv
    cnn_downsample: str = "avg"  # several cnn_stage: how finer maps reach the coarsest grid: avg (pool, channels kept) | unshuffle (space-to-depth, channels x k*k) | global_max (each channel's max over the whole image, the same in every token)
    seed: int = 0  # init seed when path is None (random timm weights), so the same config gives the same encoder

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "EncoderConfig":
        """Build from a spec mapping; unknown keys or wrong types raise GraftConfigError."""
        if d is None:
            return cls()
        if isinstance(d, cls):
            return d
        values = check_fields(cls, d, "encoder")
        if isinstance(values.get("path"), os.PathLike):
            values["path"] = os.fspath(values["path"])
        cfg = cls(**values)
        cfg.validate()
        return cfg

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def validate(self) -> None:
        """Type checks with messages naming the field (values may come from YAML or --set)."""
        _check(self.kind, str, "encoder.kind", "a registry name such as timm, siglip, clip, moonvit")
        _check_opt(self.path, str, "encoder.path", "a local directory or weights file")
        _check_opt(self.model_name, str, "encoder.model_name", "a timm model name")
        _check(self.feature_layer, int, "encoder.feature_layer", "an integer such as -2")
        _check(self.drop_prefix, bool, "encoder.drop_prefix", "true or false")
        _check_opt(self.image_size, int, "encoder.image_size", "a positive integer or null")
        _check(self.timm_kwargs, dict, "encoder.timm_kwargs", "a mapping of timm.create_model kwargs")
        _check_opt(self.max_image_tokens, int, "encoder.max_image_tokens", "a positive integer or null")
        _check(self.seed, int, "encoder.seed", "an integer")
        self._check_cnn_stage()
        if self.cnn_downsample not in CNN_DOWNSAMPLE:
            raise GraftConfigError(f"encoder.cnn_downsample must be one of {', '.join(CNN_DOWNSAMPLE)}, "
                                   f"got {self.cnn_downsample!r}")
        for name in ("image_size", "max_image_tokens"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise GraftConfigError(f"encoder.{name} must be positive, got {value}")


    def _check_cnn_stage(self) -> None:
        stage = self.cnn_stage
        hint = "a stage index such as 3 or -2, a list of distinct stage indices such as [2, 3], or null"
        if isinstance(stage, (list, tuple)):
            if not stage:
                raise GraftConfigError(f"encoder.cnn_stage must be {hint}, got an empty list; "
                                       "use null for the last feature map")
            for s in stage:
                _check(s, int, "encoder.cnn_stage", hint)
            self.cnn_stage = list(stage)
        else:
            _check_opt(stage, int, "encoder.cnn_stage", hint)


CNN_DOWNSAMPLE = ("avg", "unshuffle", "global_max")


def _check(value: Any, typ: type, name: str, hint: str) -> None:
    # bool is an int subclass: reject True where an int is expected, it is always a typo.
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise GraftConfigError(f"{name} must be {hint}, got {value!r}")


def _check_opt(value: Any, typ: type, name: str, hint: str) -> None:
    if value is not None:
        _check(value, typ, name, hint)
