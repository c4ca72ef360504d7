"""GraftForConditionalGeneration: a graft as a vLLM model.

The LLM is vLLM's own implementation of the exported LLM's architecture (Llama, Qwen2, Qwen3,
GLM4, the MoE Qwen3-MoE and GLM-4.5, ...), so it runs on vLLM's kernels (its fused MoE for
experts), KV cache and parallelism. The image path is graft's
own encoder + projector code (`graft.image_path.ImagePath`), loaded from the export's `graft/`
run dir, so every encoder and projector kind graft trains is served as graft runs it.

Where the work happens:
- front-end (the API server / `LLM` process): the processor below turns each image into RGB
  uint8 pixels and sizes its run of `<image>` tokens with `ImageTokenCounter` (no weights);
- model worker: `embed_multimodal` runs graft's preprocess + encoder + projector on those
  pixels (float32, as graft's engine does) and vLLM scatters the rows over the `<image>` runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property

import numpy as np
import torch
from torch import nn
from transformers import BatchFeature
from vllm.config import VllmConfig
from vllm.config.multimodal import MultiModalDummyOptions
from vllm.inputs import MultiModalDataDict
from vllm.model_executor.models.interfaces import MultiModalEmbeddings, SupportsMultiModal, SupportsPP
from vllm.model_executor.models.utils import (AutoWeightsLoader, WeightsMapper,
                                              init_vllm_registered_model, maybe_prefix)
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.multimodal.inputs import MultiModalFieldConfig, MultiModalKwargsItems
from vllm.multimodal.parse import ImageProcessorItems, MultiModalDataItems
from vllm.multimodal.processing import (BaseDummyInputsBuilder, BaseMultiModalProcessor,
                                        BaseProcessingInfo, PromptReplacement, PromptUpdate)
from vllm.sequence import IntermediateTensors

from graft.serving.vllm_plugin.geometry import (CONFIG_KEY, GRAFT_SUBDIR, ImageTokenCounter,
                                                load_export_spec)

PIXELS = "graft_pixels"  # the one multimodal field: an image's RGB uint8 [H, W, 3]


def _meta(hf_config) -> dict:
    return getattr(hf_config, CONFIG_KEY)


def _rgb(image):
    """An image as graft reads it: a PIL RGB image (vLLM may hand over arrays or tensors)."""
    from PIL import Image

    if isinstance(image, torch.Tensor):
        image = image.cpu().numpy()
    if isinstance(image, np.ndarray):
        image = Image.fromarray(image)
    return image.convert("RGB")


class GraftProcessingInfo(BaseProcessingInfo):
    def get_supported_mm_limits(self) -> Mapping[str, int | None]:
        return {"image": None}

    def get_supported_mm_processor_kwargs(self) -> dict[str, set[str]]:
        return {"text_kwargs": set(), "images_kwargs": set()}  # graft's preprocessing takes none

    @cached_property
    def counter(self) -> ImageTokenCounter:
        return ImageTokenCounter.from_export(self.model_id)

    @property
    def image_token_id(self) -> int:
        return int(_meta(self.get_hf_config())["image_token_id"])

    def get_num_image_tokens(self, *, image_width: int, image_height: int) -> int:
        return self.counter(image_width, image_height)


class GraftDummyInputsBuilder(BaseDummyInputsBuilder[GraftProcessingInfo]):
    def get_dummy_text(self, mm_counts: Mapping[str, int]) -> str:
        return _meta(self.info.get_hf_config())["image_token"] * mm_counts.get("image", 0)

    def get_dummy_mm_data(self, seq_len: int, mm_counts: Mapping[str, int],
                          mm_options: MultiModalDummyOptions) -> MultiModalDataDict:
        width, height = _meta(self.info.get_hf_config())["largest_image"]
        return {"image": self._get_dummy_images(width=width, height=height,
                                                num_images=mm_counts.get("image", 0),
                                                overrides=mm_options.get("image"))}


class GraftMultiModalProcessor(BaseMultiModalProcessor[GraftProcessingInfo]):
    def _call_hf_processor(self, hf_data: Mapping[str, object],
                           hf_kwargs: Mapping[str, object]) -> BatchFeature:
        # No HF processor: graft's preprocessing runs with the encoder (embed_multimodal),
        # so pixels cross the process boundary exactly as the image was given.
        images = [_rgb(im) for im in hf_data.get("images", [])]
        return BatchFeature({PIXELS: [torch.from_numpy(np.asarray(im).copy()) for im in images]})

    def _get_mm_fields_config(self, hf_inputs: BatchFeature,
                              hf_processor_mm_kwargs: Mapping[str, object]
                              ) -> Mapping[str, MultiModalFieldConfig]:
        return {PIXELS: MultiModalFieldConfig.batched("image", keep_on_cpu=True)}

    def _get_prompt_updates(self, mm_items: MultiModalDataItems,
                            hf_processor_mm_kwargs: Mapping[str, object],
                            out_mm_kwargs: MultiModalKwargsItems) -> Sequence[PromptUpdate]:
        image_id = self.info.image_token_id
        images = mm_items.get_items("image", ImageProcessorItems) if "image" in mm_items else None

        def replacement(item_idx: int) -> list[int]:
            size = images.get_image_size(item_idx)
            return [image_id] * self.info.get_num_image_tokens(image_width=size.width,
                                                               image_height=size.height)

        # a prompt-replacement target must be token ids: `<image>` is one added token
        return [PromptReplacement(modality="image", target=[image_id], replacement=replacement)]


class GraftImagePath(nn.Module):
    """graft's encoder + projector as one module (so vLLM moves and counts them)."""

    def __init__(self, export_dir: str, d_model: int):
        super().__init__()
        from graft.image_path import ImagePath

        spec = load_export_spec(export_dir)
        # float32 on the CPU first, as graft's engine runs it, whatever vLLM's default dtype
        # and device are while it builds the model; moved to the model's device after.
        device = torch.get_default_device()
        previous = torch.get_default_dtype()
        torch.set_default_dtype(torch.float32)
        try:
            with torch.device("cpu"):
                path = ImagePath.from_spec(spec, d_model, f"{export_dir}/{GRAFT_SUBDIR}")
        finally:
            torch.set_default_dtype(previous)
        self.encoder = path.encoder.float()
        self.projector = path.projector.float()
        self.path = path
        self.to(device)

    @torch.no_grad()
    def forward(self, pixels: list[torch.Tensor]) -> list[torch.Tensor]:
        return self.path.image_features([_rgb(p) for p in pixels])


@MULTIMODAL_REGISTRY.register_processor(GraftMultiModalProcessor, info=GraftProcessingInfo,
                                        dummy_inputs=GraftDummyInputsBuilder)
class GraftForConditionalGeneration(nn.Module, SupportsMultiModal, SupportsPP):
    # the export holds the LLM's own tensors (model.*, lm_head.*); graft's image path is
    # loaded from graft/ by GraftImagePath, not from vLLM's weight stream
    hf_to_vllm_mapper = WeightsMapper(orig_to_new_prefix={
        "model.": "language_model.model.", "lm_head.": "language_model.lm_head."})

    @classmethod
    def get_placeholder_str(cls, modality: str, i: int) -> str | None:
        if modality.startswith("image"):
            return "<image>"
        raise ValueError(f"graft models take images only, not {modality}")

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        meta = _meta(config)
        self.config = config
        self.configure_mm_token_handling(vocab_size=config.vocab_size,
                                         mm_token_ids=[int(meta["image_token_id"])])
        with self._mark_tower_model(vllm_config, "image"):
            mm_config = vllm_config.model_config.get_multimodal_config()
            if mm_config.get_limit_per_prompt("image") > 0:
                self.image_path = GraftImagePath(vllm_config.model_config.model, config.hidden_size)
        with self._mark_language_model(vllm_config):
            self.language_model = init_vllm_registered_model(
                vllm_config=vllm_config, hf_config=config,
                architectures=list(meta["text_architectures"]),
                prefix=maybe_prefix(prefix, "language_model"))
        self.make_empty_intermediate_tensors = self.language_model.make_empty_intermediate_tensors

    def embed_multimodal(self, **kwargs: object) -> MultiModalEmbeddings:
        pixels = kwargs.pop(PIXELS, None)
        if pixels is None:
            return []
        if isinstance(pixels, torch.Tensor):  # same-size images may arrive stacked
            pixels = list(pixels.unbind(0))
        dtype = self.language_model.model.embed_tokens.weight.dtype
        return [rows.to(dtype) for rows in self.image_path(pixels)]

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor,
                intermediate_tensors: IntermediateTensors | None = None,
                inputs_embeds: torch.Tensor | None = None, **kwargs: object
                ) -> torch.Tensor | IntermediateTensors:
        if intermediate_tensors is not None:
            inputs_embeds = None
        return self.language_model.model(input_ids, positions, intermediate_tensors,
                                         inputs_embeds=inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.language_model.compute_logits(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        loaded = AutoWeightsLoader(self).load_weights(weights, mapper=self.hf_to_vllm_mapper)
        # the image path loaded its own files at construction
        return loaded | {name for name, _ in self.named_parameters() if name.startswith("image_path.")}
