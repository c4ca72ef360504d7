"""What every encoder shares: EncoderInputs, frozen eval-mode module, image checks, identity."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from graft.encoders.config import EncoderConfig
from graft.encoders.weights import sha256_file
from graft.errors import GraftDataError


@dataclass
class EncoderInputs:
    """Preprocessed images, ready for `encode`."""

    pixel_values: torch.Tensor | list[torch.Tensor]  # fixed-resolution encoders: [B, 3, H, W]
    image_sizes: list[tuple[int, int]]  # (width, height) of each original image
    grids: list[tuple[int, int]]  # (h, w) token grid of each image, known before encoding
    extra: dict[str, Any] = field(default_factory=dict)  # kind-specific tensors (e.g. native-resolution grids)

    def __len__(self) -> int:
        return len(self.image_sizes)

    def to(self, device: torch.device | str) -> "EncoderInputs":
        def move(v: Any) -> Any:
            if isinstance(v, torch.Tensor):
                return v.to(device)
            if isinstance(v, list):
                return [move(x) for x in v]
            return v

        return EncoderInputs(move(self.pixel_values), list(self.image_sizes), list(self.grids),
                             {k: move(v) for k, v in self.extra.items()})


class VisionEncoder(nn.Module):
    """A frozen vision tower. Subclasses set `hidden_size` and implement `preprocess`,
    `encode`, `token_grid`, `weight_files` and `preprocess_identity`."""

    kind = ""
    hidden_size: int
    kept_prefix_tokens = 0  # prefix tokens (CLS...) kept in the output when drop_prefix is off

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.config = config

    def freeze(self) -> "VisionEncoder":
        for p in self.parameters():
            p.requires_grad_(False)
        return self.eval()

    def train(self, mode: bool = True) -> "VisionEncoder":
        # Frozen means frozen: BatchNorm statistics and dropout stay in eval mode even when
        # a parent module is switched to training.
        return super().train(False)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def num_tokens(self, width: int, height: int) -> int:
        gh, gw = self.token_grid(width, height)
        return gh * gw + self.kept_prefix_tokens

    def weights_digest(self) -> dict[str, str]:
        """file name -> sha256 of every weights file this encoder was built from."""
        return {str(p): sha256_file(p) for p in self.weight_files()}

    def identity(self) -> str:
        """Stable string for caches: everything that changes the output features."""
        cfg = self.config
        ident = {
            "kind": cfg.kind,
            "model_name": cfg.model_name,
            "weights": {name.rsplit("/", 1)[-1]: sha for name, sha in self.weights_digest().items()}
            or f"random-init seed={cfg.seed}",
            "feature_layer": cfg.feature_layer,
            "drop_prefix": cfg.drop_prefix,
            "image_size": cfg.image_size,
            "max_image_tokens": cfg.max_image_tokens,
            "cnn_stage": cfg.cnn_stage,
            "timm_kwargs": cfg.timm_kwargs,
            "dtype": str(self.dtype).removeprefix("torch."),
            "preprocess": json.loads(self.preprocess_identity()),
        }
        if isinstance(cfg.cnn_stage, list):  # only then does it change the features (and the
            ident["cnn_downsample"] = cfg.cnn_downsample  # keys of single-stage caches stay as they were)
        return json.dumps(ident, sort_keys=True, default=str)

    @staticmethod
    def check_images(images: Any) -> list:
        """RGB PIL images, or GraftDataError naming the bad index."""
        from PIL import Image

        if isinstance(images, Image.Image):
            images = [images]
        if not isinstance(images, (list, tuple)) or not images:
            raise GraftDataError("preprocess expects a non-empty list of PIL images")
        out = []
        for i, img in enumerate(images):
            if not isinstance(img, Image.Image):
                raise GraftDataError(f"image {i} is a {type(img).__name__}, expected a PIL.Image.Image")
            if img.width < 1 or img.height < 1:
                raise GraftDataError(f"image {i} is empty ({img.width}x{img.height})")
            try:  # PIL decodes lazily: a truncated file fails here, not deep inside a transform
                img.load()
                out.append(img if img.mode == "RGB" else img.convert("RGB"))
            except (OSError, SyntaxError, ValueError) as err:
                raise GraftDataError(f"image {i} cannot be decoded ({type(err).__name__}: {err})") from err
        return out
