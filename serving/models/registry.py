"""Which implementation serves a checkpoint, chosen by config.json `architectures`/`model_type`."""

from __future__ import annotations

import json
from pathlib import Path

from graft.serving.models.glm4 import Glm4CausalLM, glm4_flags
from graft.serving.models.glm4_moe import glm4_moe_flags
from graft.serving.models.llama import CausalLM, llama_flags, qwen2_flags, qwen3_flags
from graft.serving.models.moe import MoeCausalLM
from graft.serving.models.qwen3_moe import qwen3_moe_flags

# architecture name -> (model class, flags from the HF config)
ARCHITECTURES = {
    "LlamaForCausalLM": (CausalLM, llama_flags),
    "Qwen2ForCausalLM": (CausalLM, qwen2_flags),
    "Qwen3ForCausalLM": (CausalLM, qwen3_flags),
    "Glm4ForCausalLM": (Glm4CausalLM, glm4_flags),
    "Qwen3MoeForCausalLM": (MoeCausalLM, qwen3_moe_flags),
    "Glm4MoeForCausalLM": (MoeCausalLM, glm4_moe_flags),
}
MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
               "qwen3": "Qwen3ForCausalLM", "glm4": "Glm4ForCausalLM",
               "qwen3_moe": "Qwen3MoeForCausalLM", "glm4_moe": "Glm4MoeForCausalLM"}


def resolve_architecture(model_dir: str | Path) -> str:
    """The supported architecture named by model_dir/config.json, or a ValueError naming the field."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ValueError(f"{path} not found: Engine.from_pretrained needs an HF model directory")
    raw = json.loads(path.read_text())
    archs = raw.get("architectures") or []
    for arch in archs:
        if arch in ARCHITECTURES:
            return arch
    model_type = raw.get("model_type")
    if not archs and model_type in MODEL_TYPES:
        return MODEL_TYPES[model_type]
    raise ValueError(
        f"{path}: architectures={archs!r} (model_type={model_type!r}) is not supported by the "
        f"graft engine; supported architectures: {', '.join(ARCHITECTURES)}")


def build_model(model_dir: str | Path, hf_config):
    """An uninitialised model of the right family for hf_config (weights come from the loader)."""
    arch = resolve_architecture(model_dir)
    cls, flags = ARCHITECTURES[arch]
    layer_types = getattr(hf_config, "layer_types", None) or []
    if getattr(hf_config, "use_sliding_window", False) or "sliding_attention" in layer_types:
        raise ValueError(f"{model_dir}/config.json: use_sliding_window / layer_types with "
                         "sliding_attention is not supported by the graft engine")
    return cls(hf_config, flags(hf_config))
