"""The `moonvit` encoder kind: Kimi's MoonViT behind graft's encoder interface.

`path` is a Kimi-K2.5 or Kimi-VL checkpoint dir (only the vision tensors are read) or a dir
written by `graft extract`. Output tokens are 2x2-merged patches: hidden_size = 4 x width.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch

from graft.encoders.base import EncoderInputs, VisionEncoder
from graft.encoders.config import EncoderConfig
from graft.encoders.moonvit_model import MoonViT, MoonViTConfig
from graft.encoders.moonvit_processor import MoonViTProcessorConfig, preprocess, token_grid
from graft.encoders.moonvit_weights import CheckpointReader, load_vision_state, read_vision_config
from graft.encoders.registry import register_encoder
from graft.errors import GraftConfigError, GraftDataError


def read_processor_config(root: str | Path, vision: MoonViTConfig,
                          max_image_tokens: int | None) -> MoonViTProcessorConfig:
    """Processor limits from preprocessor_config.json (K2.5 or Kimi-VL names) when present."""
    cfg = MoonViTProcessorConfig(patch_size=vision.patch_size,
                                 merge_size=vision.merge_kernel_size[0],
                                 max_image_tokens=max_image_tokens)
    path = Path(root) / "preprocessor_config.json"
    if path.is_file():
        raw = json.loads(path.read_text())
        limit = raw.get("max_patches", raw.get("in_token_limit", raw.get("in_patch_limit")))
        if limit is not None:
            cfg.max_patches = int(limit)
        side = (raw.get("size") or {}).get("max_height", raw.get("patch_limit_on_one_side"))
        if side is not None:
            cfg.max_patches_per_side = int(side)
        if raw.get("pad_input") is not None:  # Kimi-VL: false = center-crop to multiples of 28
            cfg.pad_input = bool(raw["pad_input"])
        for name in ("image_mean", "image_std"):
            if raw.get(name) is not None:
                setattr(cfg, name, tuple(float(v) for v in raw[name]))
    if vision.merge_kernel_size[0] != vision.merge_kernel_size[1]:
        raise GraftConfigError(f"{root}: merge_kernel_size {vision.merge_kernel_size} must be square")
    if cfg.max_patches_per_side > vision.max_grid_side:
        raise GraftConfigError(
            f"{path}: images may be {cfg.max_patches_per_side} patches per side but MoonViT's "
            f"position table covers {vision.max_grid_side}; lower size.max_height")
    return cfg


@register_encoder("moonvit")
class MoonViTEncoder(VisionEncoder):
    kind = "moonvit"

    def __init__(self, config: EncoderConfig):
        super().__init__(config)
        if not config.path:
            raise GraftConfigError(
                "encoder.path is required for kind moonvit: a Kimi-K2.5 / Kimi-VL checkpoint dir "
                "or a dir written by `graft extract DONOR OUT --part vision`")
        root = Path(config.path)
        self.vision_config, _ = read_vision_config(root)
        n = self.vision_config.num_hidden_layers
        if not -(n + 1) <= config.feature_layer <= n:
            raise GraftConfigError(
                f"encoder.feature_layer={config.feature_layer}: MoonViT at {root} has {n} blocks; "
                f"use -1 (final block + final LayerNorm, what Kimi's projector reads) .. -{n + 1}")
        self.feature_layer = config.feature_layer
        self.processor = read_processor_config(root, self.vision_config, config.max_image_tokens)
        with torch.device("meta"):  # no random init of a 400M-parameter tower we overwrite
            model = MoonViT(self.vision_config)
        expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        reader = CheckpointReader(root)
        state = load_vision_state(reader, self.vision_config, expected)
        model.load_state_dict({k: v.float() for k, v in state.items()}, strict=True, assign=True)
        self.model = model
        self._weight_files = sorted(root / name for name in reader.opened)  # vision shards only
        self.hidden_size = self.vision_config.merged_size
        self.freeze()

    def preprocess(self, images) -> EncoderInputs:
        images = self.check_images(images)
        patches, grids = preprocess(images, self.processor)  # [n_patches, 3, 14, 14]
        k = self.vision_config.merge_kernel_size
        return EncoderInputs(
            pixel_values=patches,
            image_sizes=[im.size for im in images],
            grids=[(h // k[0], w // k[1]) for h, w in grids],
            extra={"patch_grids": grids},
        )

    @torch.no_grad()
    def encode(self, inputs: EncoderInputs) -> list[torch.Tensor]:
        grids = inputs.extra.get("patch_grids")
        if grids is None:
            raise GraftDataError("moonvit encode needs EncoderInputs.extra['patch_grids'] (the "
                                 "patch grid per image); build inputs with this encoder's preprocess")
        patches = inputs.pixel_values.to(self.device, self.dtype)  # [n_patches, 3, 14, 14]
        return self.model(patches, grids, self.feature_layer)

    def token_grid(self, width: int, height: int) -> tuple[int, int]:
        return token_grid(width, height, self.processor)

    def weight_files(self) -> list[Path]:
        return self._weight_files

    def preprocess_identity(self) -> str:
        return json.dumps(asdict(self.processor), sort_keys=True)

