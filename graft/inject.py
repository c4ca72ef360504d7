"""Image-token injection: splice projected image features over placeholder positions.

The same function runs in training (HF model, inputs_embeds) and in serving (our engine),
so both agree to the last bit. The placeholder id is never looked up in the LLM's
embedding table, and the vocabulary is never resized.
"""

from __future__ import annotations

import torch

# Token id marking an image position, as in the original LLaVA code (-200). Negative, so
# it can never collide with a real vocabulary entry.
IMAGE_PLACEHOLDER = -200


def embed_with_images(
    input_ids: torch.Tensor,  # [..., seq] token ids, IMAGE_PLACEHOLDER at image positions
    embed_tokens: torch.nn.Module,  # the frozen LLM input embedding
    image_features: torch.Tensor | None,  # [n_image_positions, d_model], in sequence order
) -> torch.Tensor:
    """Text rows from the frozen table, image rows overwritten with `image_features`."""
    is_image = input_ids == IMAGE_PLACEHOLDER
    embeds = embed_tokens(input_ids.masked_fill(is_image, 0))  # [..., seq, d_model]
    return splice(embeds, is_image, image_features)


def splice(
    embeds: torch.Tensor,  # [..., seq, d_model]
    is_image: torch.Tensor,  # [..., seq] bool
    image_features: torch.Tensor | None,  # [n_true, d_model]
) -> torch.Tensor:
    n_slots = int(is_image.sum())
    n_feats = 0 if image_features is None else image_features.shape[0]
    if n_slots != n_feats:
        raise ValueError(
            f"image placeholder count ({n_slots}) != image feature rows ({n_feats}); "
            "placeholder runs must be sized with the encoder/projector token counts")
    if n_slots == 0:
        return embeds
    out = embeds.clone()
    out[is_image] = image_features.to(dtype=embeds.dtype, device=embeds.device)
    return out
