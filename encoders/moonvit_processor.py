"""MoonViT's image processor: resize under a patch budget, pad/crop to multiples of 28, patchify.

Follows Kimi-K2.5's processor (never upscale, bicubic + antialias, zero padding at the
bottom/right, mean = std = 0.5), so the same image gives the same pixels and token count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from graft.errors import GraftConfigError, GraftDataError


@dataclass
class MoonViTProcessorConfig:
    patch_size: int = 14  # pixels per patch side
    merge_size: int = 2  # patches per output-token side (tokens = patches / merge_size**2)
    max_patches: int = 16384  # patch budget of one image before padding (Kimi's in_patch_limit)
    max_patches_per_side: int = 512  # longest side in patches (Kimi's patch_limit_on_one_side)
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)  # per-channel mean on [0, 1] pixels
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)  # per-channel std on [0, 1] pixels
    max_image_tokens: int | None = None  # hard cap on output tokens per image (None: Kimi's limits)
    pad_input: bool = True  # pad up to multiples of 28 (K2.5); false: center-crop down (Kimi-VL)


def _kimi_fit(width: int, height: int, cfg: MoonViTProcessorConfig, max_patches: float):
    """Kimi's navit resize: one scale <= 1 meeting the total and per-side patch budgets."""
    p = cfg.patch_size
    side_px = cfg.max_patches_per_side * p
    n_patches = max(1, height // p) * max(1, width // p)
    scale = min(1.0, math.sqrt(max_patches / n_patches), side_px / height, side_px / width)
    new_h = min(max(1, int(height * scale)), side_px)
    new_w = min(max(1, int(width * scale)), side_px)
    return new_w, new_h


def _pad_up(n: int, factor: int) -> int:
    return -(-n // factor) * factor


def _final(n: int, factor: int, pad: bool) -> int:
    """Side length after padding up / cropping down to a multiple of `factor` (never to 0)."""
    return _pad_up(n, factor) if pad or n < factor else n - n % factor


def fit_size(width: int, height: int, cfg: MoonViTProcessorConfig):
    """(resized (w, h), final (w, h)) in pixels for an image of `width` x `height`; the final
    size is the resized one padded or center-cropped to multiples of patch x merge (28)."""
    if width < 1 or height < 1:
        raise GraftDataError(f"image size {width}x{height}: both sides must be >= 1 pixel")
    factor = cfg.patch_size * cfg.merge_size
    new_w, new_h = _kimi_fit(width, height, cfg, cfg.max_patches)
    budget = cfg.max_image_tokens
    if budget is not None:
        if budget < 1:
            raise GraftConfigError(f"max_image_tokens={budget}: must be >= 1 (or null for no cap)")
        budget_patches = min(cfg.max_patches, budget * cfg.merge_size ** 2)
        new_w, new_h = _kimi_fit(width, height, cfg, budget_patches)
        # Padding to multiples of 28 can add tokens: shrink until the final grid fits.
        while (_final(new_w, factor, cfg.pad_input) // factor) * \
                (_final(new_h, factor, cfg.pad_input) // factor) > budget:
            new_w, new_h = max(1, int(new_w * 0.97)), max(1, int(new_h * 0.97))
    final = (_final(new_w, factor, cfg.pad_input), _final(new_h, factor, cfg.pad_input))
    return (new_w, new_h), final


def token_grid(width: int, height: int, cfg: MoonViTProcessorConfig) -> tuple[int, int]:
    """(rows, cols) of output tokens for an image of `width` x `height` pixels."""
    _, (out_w, out_h) = fit_size(width, height, cfg)
    factor = cfg.patch_size * cfg.merge_size
    return out_h // factor, out_w // factor


def preprocess(images, cfg: MoonViTProcessorConfig):
    """PIL images -> (patches [n_patches, 3, p, p] fp32, patch grids [(h, w)] per image)."""
    import numpy as np
    from torchvision.transforms.v2 import InterpolationMode
    from torchvision.transforms.v2 import functional as tvF

    p = cfg.patch_size
    mean = torch.tensor(cfg.image_mean).view(3, 1, 1) * 255.0
    std = torch.tensor(cfg.image_std).view(3, 1, 1) * 255.0
    all_patches, grids = [], []
    for i, image in enumerate(images):
        if not hasattr(image, "convert"):
            raise GraftDataError(f"image {i}: expected a PIL image, got {type(image).__name__}")
        rgb = np.asarray(image.convert("RGB"))
        x = torch.from_numpy(rgb.copy()).permute(2, 0, 1)  # [3, H, W] uint8
        (new_w, new_h), (out_w, out_h) = fit_size(x.shape[2], x.shape[1], cfg)
        if (new_h, new_w) != tuple(x.shape[1:]):
            x = tvF.resize(x, [new_h, new_w], interpolation=InterpolationMode.BICUBIC,
                           antialias=True)
        crop_h, crop_w = min(new_h, out_h), min(new_w, out_w)
        if (crop_h, crop_w) != (new_h, new_w):
            x = tvF.center_crop(x, [crop_h, crop_w])
        if (out_h, out_w) != (crop_h, crop_w):
            x = tvF.pad(x, [0, 0, out_w - crop_w, out_h - crop_h], fill=0)  # bottom/right
        x = (x.float() - mean) / std  # [3, out_h, out_w]
        gh, gw = out_h // p, out_w // p
        patches = x.view(3, gh, p, gw, p).permute(1, 3, 0, 2, 4).reshape(gh * gw, 3, p, p)
        all_patches.append(patches)
        grids.append((gh, gw))
    if not all_patches:
        raise GraftDataError("preprocess got no images")
    return torch.cat(all_patches), grids
