"""ImagePath: frozen encoder + projector, from PIL images to LLM-width embeddings, and the
token count of an image before anything is encoded. Training (`GraftedModel`) and serving
(`MultimodalFront`) both hold one; neither needs the other's half.
"""

from __future__ import annotations

from pathlib import Path

import torch

from graft.errors import GraftConfigError
from graft.spec import GraftSpec


def llm_dir(path: str) -> str:
    """spec.llm.path expanded; an error naming the field when it is not an HF model dir."""
    path = GraftSpec.expand(path)
    if not Path(path, "config.json").is_file():
        raise GraftConfigError(f"llm.path {path}: no config.json; point it at a local HF model dir")
    return path


def llm_width(path: str) -> int:
    """hidden_size of the LLM at spec.llm.path, read from its config (no weights)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(llm_dir(path)).hidden_size


class ImagePath:
    """An encoder (frozen) and a projector sharing one device. Not an nn.Module: the modules
    stay registered where they are trained (`GraftedModel.encoder/.projector`), this holds
    references to the same objects."""

    def __init__(self, encoder, projector):
        self.encoder = encoder
        self.projector = projector
        encoder.eval()
        for p in encoder.parameters():
            p.requires_grad_(False)

    @classmethod
    def from_spec(cls, spec: GraftSpec, d_model: int, adapter_dir: str | Path | None = None,
                  encoder=None) -> "ImagePath":
        """The spec's encoder (or `encoder`, when several grafts share one) and its projector:
        loaded from adapter_dir (else spec.adapter_init) or freshly built for d_model.
        A loaded projector's config replaces spec.adapter: the weights are the truth."""
        from graft.adapters import build_adapter, load_adapter
        from graft.encoders import build_encoder

        encoder = encoder if encoder is not None else build_encoder(spec.encoder_config())
        adapter_dir = adapter_dir or GraftSpec.expand(spec.adapter_init)
        if adapter_dir is None:
            return cls(encoder, build_adapter(spec.adapter_config(), encoder.hidden_size, d_model))
        projector = load_adapter(adapter_dir)
        if projector.d_vision != encoder.hidden_size or projector.d_model != d_model:
            raise GraftConfigError(
                f"adapter in {adapter_dir} maps {projector.d_vision}->{projector.d_model}, "
                f"but encoder gives {encoder.hidden_size} and the LLM takes {d_model}")
        spec.adapter = projector.config.to_dict()
        return cls(encoder, projector)

    def to(self, device) -> "ImagePath":
        self.encoder.to(device)
        self.projector.to(device)
        return self

    @property
    def device(self) -> torch.device:
        return next(self.projector.parameters()).device

    @property
    def d_model(self) -> int:
        return self.projector.d_model

    def image_token_count(self, width: int, height: int) -> int:
        n = self.encoder.num_tokens(width, height)
        return self.projector.num_output_tokens(n, grid=self.encoder.token_grid(width, height))

    @torch.no_grad()
    def encode_images(self, images) -> list[torch.Tensor]:
        """Frozen encoder features, one [n_i, d_vision] per PIL image."""
        if not images:
            return []
        inputs = self.encoder.preprocess(list(images))
        return [f.float() for f in self.encoder.encode(inputs)]

    def project(self, features: list[torch.Tensor], sizes: list[tuple[int, int]]) -> list[torch.Tensor]:
        """Projector over each image's features; sizes are (width, height) for the grid."""
        dtype = next(self.projector.parameters()).dtype
        return [self.projector(f.to(self.device, dtype), grid=self.encoder.token_grid(w, h))
                for f, (w, h) in zip(features, sizes)]

    def image_features(self, images) -> list[torch.Tensor]:
        """Projected embeddings, one [n_image_tokens_i, d_model] per image."""
        return self.project(self.encode_images(images), [im.size for im in images])
