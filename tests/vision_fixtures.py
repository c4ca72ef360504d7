"""Tiny random vision checkpoints, built offline once per test session.

Fixtures (all session-scoped, each builds in well under a second):
- `tiny_siglip_dir`, `tiny_clip_dir`: vision-only HF dirs (SiglipVisionModel / CLIPVisionModel,
  hidden 32, 3 layers, image 32, patch 8 -> 4x4 grid) with a preprocessor_config.json.
- `tiny_siglip_full_dir`, `tiny_clip_full_dir`: full SiglipModel / CLIPModel dirs (tiny text
  tower too) whose vision weights equal the vision-only dirs'.
- `tiny_timm_vit_file`: model.safetensors of timm vit_tiny_patch16_224 shrunk with
  TINY_VIT_KWARGS (img 32, patch 8, width 32, depth 2 -> 16 tokens).
- `tiny_timm_cnn_file`: model.safetensors of a random timm efficientnet_lite0 (with its
  classifier, as ImageNet checkpoints have it); use image_size 64 -> 2x2 = 4 tokens of 1280.
- `tiny_encoder_config(kind)`: kind in siglip | clip | timm_vit | timm_cnn (timm = timm_vit)
  -> an EncoderConfig for the checkpoints above.
"""

from __future__ import annotations

import pytest

TINY_VIT_KWARGS = {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2}
_VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 2,
           "image_size": 32, "patch_size": 8}
_TEXT = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
         "vocab_size": 64, "max_position_embeddings": 16, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}


def _save_hf(family: str, out, full: bool) -> str:
    import torch
    import transformers as tf

    torch.manual_seed(0)
    if family == "siglip":
        vision_cfg = tf.SiglipVisionConfig(**_VISION)
        processor = tf.SiglipImageProcessor(size={"height": 32, "width": 32})
        vision = tf.SiglipVisionModel(vision_cfg)
        model = tf.SiglipModel(tf.SiglipConfig(text_config=_TEXT, vision_config=vision_cfg.to_dict())) if full else vision
    else:
        vision_cfg = tf.CLIPVisionConfig(**_VISION, projection_dim=32)
        # Shortest-edge resize then center crop, like real CLIP processors.
        processor = tf.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
        vision = tf.CLIPVisionModel(vision_cfg)
        model = tf.CLIPModel(tf.CLIPConfig(text_config=_TEXT, vision_config=vision_cfg.to_dict(),
                                           projection_dim=32)) if full else vision
    if full:  # same vision numbers as the vision-only dir
        model.vision_model.load_state_dict(vision.state_dict())
    model.save_pretrained(str(out))
    processor.save_pretrained(str(out))
    return str(out)


@pytest.fixture(scope="session")
def tiny_siglip_dir(tmp_path_factory):
    return _save_hf("siglip", tmp_path_factory.mktemp("siglip"), full=False)


@pytest.fixture(scope="session")
def tiny_siglip_full_dir(tmp_path_factory):
    return _save_hf("siglip", tmp_path_factory.mktemp("siglip_full"), full=True)


@pytest.fixture(scope="session")
def tiny_clip_dir(tmp_path_factory):
    return _save_hf("clip", tmp_path_factory.mktemp("clip"), full=False)


@pytest.fixture(scope="session")
def tiny_clip_full_dir(tmp_path_factory):
    return _save_hf("clip", tmp_path_factory.mktemp("clip_full"), full=True)


def _save_timm(name: str, out, **kwargs) -> str:
    import timm
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, **kwargs)
    path = out / "model.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return str(path)


@pytest.fixture(scope="session")
def tiny_timm_vit_file(tmp_path_factory):
    return _save_timm("vit_tiny_patch16_224", tmp_path_factory.mktemp("timm_vit"), **TINY_VIT_KWARGS)


@pytest.fixture(scope="session")
def tiny_timm_cnn_file(tmp_path_factory):
    return _save_timm("efficientnet_lite0", tmp_path_factory.mktemp("timm_cnn"))


@pytest.fixture(scope="session")
def tiny_encoder_config(request):
    """kind -> EncoderConfig for the tiny checkpoints; builds only the one asked for."""
    from graft.encoders import EncoderConfig

    def make(kind: str = "siglip", **overrides) -> EncoderConfig:
        if kind == "siglip":
            cfg = dict(kind="siglip", path=request.getfixturevalue("tiny_siglip_dir"))
        elif kind == "clip":
            cfg = dict(kind="clip", path=request.getfixturevalue("tiny_clip_dir"))
        elif kind in ("timm", "timm_vit"):
            cfg = dict(kind="timm", model_name="vit_tiny_patch16_224", timm_kwargs=dict(TINY_VIT_KWARGS),
                       path=request.getfixturevalue("tiny_timm_vit_file"))
        elif kind == "timm_cnn":
            cfg = dict(kind="timm", model_name="efficientnet_lite0", image_size=64,
                       path=request.getfixturevalue("tiny_timm_cnn_file"))
        else:
            raise ValueError(f"tiny_encoder_config: unknown kind {kind!r} (siglip, clip, timm_vit, timm_cnn)")
        cfg.update(overrides)
        return EncoderConfig.from_dict(cfg)

    return make
