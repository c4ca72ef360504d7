"""HF SigLIP / CLIP vision towers from a local dir (vision-only or full dual-encoder checkpoint)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from PIL import Image

from graft.encoders.base import EncoderInputs, VisionEncoder
from graft.encoders.config import EncoderConfig
from graft.encoders.registry import register_encoder
from graft.errors import GraftConfigError

# Preprocessor settings that change pixel values; recorded in preprocess_identity().
_PREPROCESS_KEYS = ("do_resize", "size", "resample", "do_center_crop", "crop_size", "do_rescale", "rescale_factor",
                    "do_normalize", "image_mean", "image_std", "do_convert_rgb")


def _read_config(path: str, kind: str, model_types: tuple[str, ...]) -> dict:
    root = Path(path)
    if not (root / "config.json").is_file():
        raise GraftConfigError(
            f"encoder.path {path!r} is not a HF checkpoint dir (no config.json); "
            f"kind {kind!r} needs a local dir saved with save_pretrained"
        )
    cfg = json.loads((root / "config.json").read_text())
    if cfg.get("model_type") not in model_types:
        raise GraftConfigError(
            f"encoder.path {path!r} holds a {cfg.get('model_type')!r} checkpoint but encoder.kind is {kind!r} "
            f"(expects model_type {' or '.join(model_types)}); fix encoder.kind"
        )
    # transformers 5 saves a full processor as processor_config.json (image settings nested).
    if not any((root / name).is_file() for name in ("preprocessor_config.json", "processor_config.json")):
        raise GraftConfigError(
            f"encoder.path {path!r} has no preprocessor_config.json (or processor_config.json); save the "
            "checkpoint's image processor there (processor.save_pretrained(dir)) so graft preprocesses "
            "like the model was trained"
        )
    return cfg


def _find_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    for name, module in model.named_modules():
        if name.endswith("encoder.layers") and isinstance(module, torch.nn.ModuleList):
            return module
    raise GraftConfigError(f"cannot find the transformer layers of {type(model).__name__}")


class HFTowerEncoder(VisionEncoder):
    """hidden_states[feature_layer] of a HF vision tower; preprocessing is the dir's own image processor."""

    model_types: tuple[str, ...] = ()
    prefix_tokens = 0

    def __init__(self, config: EncoderConfig):
        super().__init__(config)
        from transformers import AutoImageProcessor
        from transformers.utils import logging as hf_logging

        if not config.path:
            raise GraftConfigError(f"encoder.path is required for kind {self.kind!r}: a local checkpoint dir")
        _read_config(config.path, self.kind, self.model_types)
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # a full dual-encoder dir reports every text weight as unexpected
        try:
            model, info = self.model_class().from_pretrained(config.path, output_loading_info=True)
        finally:
            hf_logging.set_verbosity(verbosity)
        missing = sorted(info.get("missing_keys") or [])
        if missing:
            raise GraftConfigError(
                f"encoder.path {config.path!r} lacks {len(missing)} vision weight(s), e.g. {missing[:4]}; "
                f"it is not a complete {self.kind} vision checkpoint"
            )
        try:
            self.processor = AutoImageProcessor.from_pretrained(config.path)
        except (OSError, ValueError, KeyError) as err:
            raise GraftConfigError(f"encoder.path {config.path!r}: cannot load its image processor ({err})") from err
        self.patch_size = int(model.config.patch_size)
        self._overrides = self._size_overrides(config.image_size)
        self.input_size = self._probe_input_size()
        if any(s % self.patch_size for s in self.input_size):
            raise GraftConfigError(
                f"encoder image size {self.input_size} is not a multiple of the patch size {self.patch_size}; "
                "fix encoder.image_size"
            )
        self.interpolate = self.input_size != (model.config.image_size,) * 2
        self.layer_index = self._layer_index(model.config.num_hidden_layers)
        layers = _find_layers(model)
        # Later layers never influence hidden_states[layer_index]; one stays so that
        # hidden_states (recorded per layer) exists even for layer 0, the embeddings.
        del layers[max(self.layer_index, 1):]
        if getattr(model, "use_head", False):
            model.use_head = False  # the pooling head only feeds pooler_output, which we never read
            del model.head
        self.model = model.eval()
        self.hidden_size = int(model.config.hidden_size)
        self.kept_prefix_tokens = 0 if config.drop_prefix else self.prefix_tokens

    def _layer_index(self, n_layers: int) -> int:
        fl = self.config.feature_layer
        if not -(n_layers + 1) <= fl <= n_layers:
            raise GraftConfigError(
                f"encoder.feature_layer={fl} is out of range: {self.config.path!r} has {n_layers} layers, so "
                f"hidden_states has {n_layers + 1} entries; use -1..-{n_layers + 1} or 0..{n_layers}"
            )
        return fl if fl >= 0 else n_layers + 1 + fl

    def _size_overrides(self, size: int | None) -> dict:
        if size is None:
            return {}
        p = self.processor
        if getattr(p, "do_center_crop", False) and getattr(p, "crop_size", None):
            return {"size": {"shortest_edge": size}, "crop_size": {"height": size, "width": size}}
        return {"size": {"height": size, "width": size}}

    def _run_processor(self, images: list) -> torch.Tensor:
        return self.processor(images=images, return_tensors="pt", **self._overrides)["pixel_values"]

    def _probe_input_size(self) -> tuple[int, int]:
        # Two aspect ratios: a processor whose output size follows the image cannot feed a fixed grid.
        shapes = {tuple(self._run_processor([Image.new("RGB", wh)]).shape[-2:]) for wh in ((37, 23), (23, 37))}
        if len(shapes) != 1:
            raise GraftConfigError(
                f"the image processor in {self.config.path!r} gives sizes {sorted(shapes)} for different aspect "
                "ratios; it must produce one fixed size (enable center crop or a height/width resize)"
            )
        return shapes.pop()

    def preprocess(self, images) -> EncoderInputs:
        images = self.check_images(images)
        pixels = self._run_processor(images).float()  # [B, 3, H, W]
        grid = self.token_grid(0, 0)
        return EncoderInputs(pixels, [img.size for img in images], [grid] * len(images))

    @torch.no_grad()
    def encode(self, inputs: EncoderInputs) -> list[torch.Tensor]:
        pixels = inputs.pixel_values.to(self.device, self.dtype)
        out = self.model(pixel_values=pixels, output_hidden_states=True, interpolate_pos_encoding=self.interpolate)
        feats = out.hidden_states[self.layer_index]  # [B, prefix + h*w, D]
        if self.config.drop_prefix and self.prefix_tokens:
            feats = feats[:, self.prefix_tokens:]
        return list(feats.unbind(0))

    def token_grid(self, width: int, height: int) -> tuple[int, int]:
        return self.input_size[0] // self.patch_size, self.input_size[1] // self.patch_size

    def weight_files(self) -> list[str]:
        root = Path(self.config.path)
        return sorted(str(p) for p in [*root.glob("*.safetensors"), *root.glob("*.bin")])

    def preprocess_identity(self) -> str:
        settings = self.processor.to_dict()
        ident = {k: settings.get(k) for k in _PREPROCESS_KEYS}
        ident.update(self._overrides)
        ident["processor"] = type(self.processor).__name__  # slow (PIL) and fast (torchvision) differ slightly
        return json.dumps(ident, sort_keys=True, default=str)


@register_encoder("siglip")
class SiglipEncoder(HFTowerEncoder):
    kind = "siglip"
    model_types = ("siglip", "siglip_vision_model")
    prefix_tokens = 0  # SigLIP has no CLS token

    @staticmethod
    def model_class():
        from transformers import SiglipVisionModel

        return SiglipVisionModel


@register_encoder("clip")
class ClipEncoder(HFTowerEncoder):
    kind = "clip"
    model_types = ("clip", "clip_vision_model")
    prefix_tokens = 1  # CLS

    @staticmethod
    def model_class():
        from transformers import CLIPVisionModel

        return CLIPVisionModel
