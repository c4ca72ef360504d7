"""Tiny random Kimi donors built offline: K2.5 (as transformers saves it), transformers'
in-memory names, and Kimi-VL; vision/projector tensors in one shard, the LLM in another."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

VISION = dict(hidden_size=32, num_attention_heads=2, num_hidden_layers=2, intermediate_size=64,
              pos_emb_height=8, pos_emb_width=8)
VISION_SHARD = "model-00001-of-00002.safetensors"
LLM_SHARD = "model-00002-of-00002.safetensors"
PREPROCESSOR = {"max_patches": 256, "size": {"max_height": 16, "max_width": 16},
                "patch_size": 14, "merge_size": 2,
                "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}


def build_k25_model(seed: int = 0):
    from transformers import DeepseekV3Config
    from transformers.models.kimi_k25 import Kimi_K25Config
    from transformers.models.kimi_k25.modeling_kimi_k25 import Kimi_K25ForConditionalGeneration

    torch.manual_seed(seed)
    text = DeepseekV3Config(
        vocab_size=128, hidden_size=64, intermediate_size=64, moe_intermediate_size=32,
        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, n_routed_experts=4,
        num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=None,
        kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, n_group=1,
        topk_group=1, pad_token_id=0)
    cfg = Kimi_K25Config(vision_config=dict(VISION), text_config=text.to_dict(),
                         projection_hidden_size=VISION["hidden_size"])
    model = Kimi_K25ForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # biases and norms start at 0/1: randomize so every tensor matters
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def _is_mm(key: str) -> bool:
    return bool(re.match(r"^(model\.)?(vision_tower|mm_projector|multi_modal_projector)\.", key))


def reshard(tensors: dict, out: Path) -> None:
    """Vision + projector in shard 1, everything else (the LLM) in shard 2, with an index."""
    from safetensors.torch import save_file

    # clone(): tied tensors (lm_head / embed_tokens) must not share storage on disk
    mm = {k: v.clone() for k, v in tensors.items() if _is_mm(k)}
    rest = {k: v.clone() for k, v in tensors.items() if not _is_mm(k)}
    save_file(mm, str(out / VISION_SHARD), metadata={"format": "pt"})
    save_file(rest, str(out / LLM_SHARD), metadata={"format": "pt"})
    weight_map = {k: VISION_SHARD for k in mm} | {k: LLM_SHARD for k in rest}
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))
    (out / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))


def save_k25(model, out: Path) -> Path:
    """The K2.5 layout exactly as transformers' save_pretrained writes it, resharded."""
    from safetensors.torch import load_file

    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    files = sorted(out.glob("*.safetensors"))
    tensors = {}
    for f in files:
        tensors.update(load_file(str(f)))
        f.unlink()
    (out / "model.safetensors.index.json").unlink(missing_ok=True)
    reshard(tensors, out)
    return out


def save_hf_names(model, out: Path) -> Path:
    """transformers' in-memory names (model.vision_tower.layers.N.attn.q_proj ...)."""
    out.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(str(out))
    reshard(dict(model.state_dict()), out)
    return out


def save_kimi_vl(k25_dir: Path, out: Path) -> Path:
    """Kimi-VL names from the K2.5 release layout (same numbers): multi_modal_projector.*,
    vision_tower.patch_embed.*, language_model.*, model_type kimi_vl with init_pos_emb_*."""
    from safetensors.torch import load_file

    out.mkdir(parents=True, exist_ok=True)
    tensors = load_file(str(k25_dir / VISION_SHARD)) | load_file(str(k25_dir / LLM_SHARD))
    renamed = {}
    for key, value in tensors.items():
        key = key.replace("vision_tower.encoder.patch_embed.", "vision_tower.patch_embed.")
        key = re.sub(r"^(model\.)?mm_projector\.(pre_norm|proj\.0|proj\.2)", lambda m: {
            "pre_norm": "multi_modal_projector.pre_norm",
            "proj.0": "multi_modal_projector.linear_1",
            "proj.2": "multi_modal_projector.linear_2"}[m.group(2)], key)
        renamed[key] = value
    k25 = json.loads((k25_dir / "config.json").read_text())
    v = k25["vision_config"]
    vision = {"model_type": "moonvit", "patch_size": v["patch_size"],
              "init_pos_emb_height": v["pos_emb_height"], "init_pos_emb_width": v["pos_emb_width"],
              "num_attention_heads": v["num_attention_heads"],
              "num_hidden_layers": v["num_hidden_layers"], "hidden_size": v["hidden_size"],
              "intermediate_size": v["intermediate_size"], "merge_kernel_size": [2, 2]}
    config = {"model_type": "kimi_vl", "vision_config": vision, "text_config": k25["text_config"]}
    (out / "config.json").write_text(json.dumps(config))
    reshard(renamed, out)
    (out / "preprocessor_config.json").write_text(json.dumps(
        {"in_token_limit": 256, "patch_size": 14, "merge_kernel_size": [2, 2],
         "patch_limit_on_one_side": 16, "image_mean": [0.5] * 3, "image_std": [0.5] * 3}))
    return out
