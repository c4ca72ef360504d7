"""Donor extraction: the vision tower and/or projector of a VLM checkpoint as graft parts.

Kimi-K2.5 / Kimi-VL donors give a `moonvit` encoder dir and an `mlp` adapter (pre-norm in 4
chunks + Kimi's two Linears); HF Llava donors give a `clip`/`siglip` encoder dir and an `mlp`
adapter. Tensors are read key by key, so the donor's language model is never loaded.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from graft.encoders.moonvit_weights import (CheckpointReader, load_projector_state,
                                            load_vision_state, read_vision_config)
from graft.errors import GraftConfigError
from graft.io import atomic_write_dir, atomic_write_json, check_output_path

PARTS = ("vision", "projector", "both")
MARKER = "graft_extract.json"  # written into every extracted encoder dir
SUMMARY = "extract.json"  # OUT's own marker: a dir holding it was written by graft extract
KIMI_TYPES = ("kimi_k25", "kimi_vl")
LLAVA_TYPES = ("llava",)
TOWER_KINDS = {"clip_vision_model": "clip", "siglip_vision_model": "siglip"}
_LLAVA_TOWER = re.compile(r"^(model\.)?vision_tower\.")
_LLAVA_PROJECTOR = re.compile(r"^(model\.)?multi_modal_projector\.")


def donor_config(root: str | Path) -> dict:
    path = Path(root) / "config.json"
    if not path.is_file():
        raise GraftConfigError(f"donor {root}: no config.json; give a local Kimi-K2.5, Kimi-VL "
                               "or HF Llava checkpoint dir")
    config = json.loads(path.read_text())
    if config.get("model_type") not in KIMI_TYPES + LLAVA_TYPES:
        raise GraftConfigError(
            f"donor {root}: model_type {config.get('model_type')!r} is not supported; "
            f"extract works on {', '.join(KIMI_TYPES + LLAVA_TYPES)} checkpoints")
    return config


def _mlp_adapter(parts: dict, d_model: int | None, seed: int):
    """A depth-2 graft `mlp` adapter holding a donor projector's tensors.

    parts: linear_{1,2}.{weight,bias} (+ pre_norm.{weight,bias}); a missing bias is zero.
    With `d_model` set, linear_2 is a fresh seeded Linear of that width (to be trained for a
    different LLM); otherwise it is the donor's.
    """
    from graft.adapters import AdapterConfig, build_adapter

    w1 = parts["linear_1.weight"]
    norm = parts.get("pre_norm.weight")
    chunks = w1.shape[1] // norm.shape[0] if norm is not None else 1
    keep_out = d_model is None
    cfg = AdapterConfig(kind="mlp", depth=2, hidden_size=w1.shape[0], layer_norm=norm is not None,
                        norm_chunks=chunks, seed=seed)
    adapter = build_adapter(cfg, w1.shape[1], parts["linear_2.weight"].shape[0] if keep_out else d_model)
    ours = {"mlp.linears.0": "linear_1"} | ({"mlp.linears.1": "linear_2"} if keep_out else {})
    if norm is not None:
        ours["norm"] = "pre_norm"
    state = adapter.state_dict()
    with torch.no_grad():
        for name, src in ours.items():
            state[f"{name}.weight"].copy_(parts[f"{src}.weight"].float())
            bias = parts.get(f"{src}.bias")  # Llava with multimodal_projector_bias=False: none
            if bias is None:
                state[f"{name}.bias"].zero_()
            else:
                state[f"{name}.bias"].copy_(bias.float())
    return adapter


def kimi_projector_adapter(donor: str | Path, d_model: int | None = None, seed: int = 0):
    """Kimi's projector as a graft `mlp` adapter on MoonViT's 2x2-merged tokens: pre_norm
    (4 chunks) and linear_1 are Kimi's; linear_2 too unless `d_model` asks for a new one."""
    reader = donor if isinstance(donor, CheckpointReader) else CheckpointReader(donor)
    config = json.loads((reader.root / "config.json").read_text())
    eps = float(config.get("projection_layer_norm_eps", 1e-5))
    if eps != 1e-5:
        raise GraftConfigError(
            f"{reader.root}: projection_layer_norm_eps={eps}; graft's adapter pre-norm uses 1e-5")
    return _mlp_adapter(load_projector_state(reader), d_model, seed)


def llava_projector_adapter(reader: CheckpointReader, config: dict, d_model: int | None = None,
                            seed: int = 0):
    """Llava's multi_modal_projector (linear_1, GELU, linear_2) as a graft `mlp` adapter."""
    act = config.get("projector_hidden_act", "gelu")
    if act != "gelu":
        raise GraftConfigError(f"{reader.root}: projector_hidden_act={act!r}; graft's mlp "
                               "adapter uses GELU (exact erf), so only 'gelu' converts")
    tensors = {_LLAVA_PROJECTOR.sub("", k): reader.get(k)
               for k in reader.keys() if _LLAVA_PROJECTOR.match(k)}
    for name in ("linear_1.weight", "linear_2.weight"):
        if name not in tensors:
            raise GraftConfigError(f"{reader.root}: no tensor multi_modal_projector.{name}; "
                                   "expected an HF Llava checkpoint")
    w1, w2 = tensors["linear_1.weight"], tensors["linear_2.weight"]
    if w2.shape[1] != w1.shape[0]:
        raise GraftConfigError(
            f"{reader.root}: multi_modal_projector.linear_2.weight has shape {tuple(w2.shape)}, "
            f"expected input width {w1.shape[0]} (linear_1's output)")
    return _mlp_adapter(tensors, d_model, seed)


def check_output_dir(out: Path, marker: str) -> None:
    """Refuse (one line) an OUT that cannot be written as a dir, or a non-empty one without
    `marker` (not written by graft: a user's files are never replaced). Called before any work,
    and again by write_dir_atomically just before the swap."""
    check_output_path(out, "dir")
    if out.is_dir() and any(out.iterdir()) and not (out / marker).is_file():
        raise GraftConfigError(f"{out} exists and was not written by graft (no {marker}); "
                               "choose an empty or new output dir")


def write_dir_atomically(out: Path, write, marker: str) -> None:
    """Build the dir in a sibling temp dir and move it into place: no half-written parts.

    An existing non-empty `out` is replaced only if it holds `marker` (graft wrote it).
    """
    check_output_dir(out, marker)
    atomic_write_dir(out, write)


def _write_encoder_dir(out: Path, tensors: dict, config: dict, processor: dict, donor: Path) -> None:
    """An HF-style encoder dir: model.safetensors, config.json, preprocessor_config.json."""
    from safetensors.torch import save_file

    def write(tmp: Path) -> None:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / "model.safetensors"),
                  metadata={"format": "pt"})
        atomic_write_json(tmp / "config.json", config)
        atomic_write_json(tmp / "preprocessor_config.json", processor)
        atomic_write_json(tmp / MARKER, {"donor": str(donor)})

    write_dir_atomically(out, write, MARKER)


def _extract_kimi_vision(reader: CheckpointReader, out: Path) -> dict:
    from graft.encoders.moonvit import read_processor_config
    from graft.encoders.moonvit_model import MoonViT

    cfg, _ = read_vision_config(reader.root)
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in MoonViT(cfg).state_dict().items()}
    state = load_vision_state(reader, cfg, expected)
    proc = read_processor_config(reader.root, cfg, None)
    config = {"architectures": ["Kimi_K25VisionModel"], "model_type": "kimi_k25_vision",
              "patch_size": cfg.patch_size, "hidden_size": cfg.hidden_size,
              "intermediate_size": cfg.intermediate_size,
              "num_attention_heads": cfg.num_attention_heads,
              "num_hidden_layers": cfg.num_hidden_layers, "pos_emb_height": cfg.pos_emb_height,
              "pos_emb_width": cfg.pos_emb_width, "hidden_act": "gelu_pytorch_tanh",
              "merge_kernel_size": list(cfg.merge_kernel_size),
              "rope_parameters": {"rope_theta": cfg.rope_theta, "rope_type": "axial"}}
    side = proc.max_patches_per_side
    processor = {"image_processor_type": "Kimi_K25ImageProcessor", "max_patches": proc.max_patches,
                 "size": {"max_height": side, "max_width": side}, "patch_size": proc.patch_size,
                 "merge_size": proc.merge_size, "image_mean": list(proc.image_mean),
                 "image_std": list(proc.image_std)}
    if not proc.pad_input:  # Kimi-VL's crop mode; K2.5's processor always pads
        processor["pad_input"] = False

    _write_encoder_dir(out, state, config, processor, reader.root)
    return {"kind": "moonvit", "path": str(out), "feature_layer": -1}


def _llava_image_processor(root: Path) -> dict:
    """The image processor settings: preprocessor_config.json, or the `image_processor` entry
    of the processor_config.json that transformers 5 writes for a LlavaProcessor."""
    if (root / "preprocessor_config.json").is_file():
        return json.loads((root / "preprocessor_config.json").read_text())
    if (root / "processor_config.json").is_file():
        nested = json.loads((root / "processor_config.json").read_text()).get("image_processor")
        if isinstance(nested, dict):
            return nested
    raise GraftConfigError(f"{root}: no preprocessor_config.json or processor_config.json with an "
                           "image_processor; save the Llava processor next to the weights "
                           "(processor.save_pretrained(dir))")


def _extract_llava_vision(reader: CheckpointReader, config: dict, out: Path) -> dict:
    vision = dict(config.get("vision_config") or {})
    kind = TOWER_KINDS.get(vision.get("model_type"))
    if kind is None:
        raise GraftConfigError(
            f"{reader.root}: Llava vision_config.model_type={vision.get('model_type')!r}; graft "
            f"extracts {', '.join(TOWER_KINDS)} towers (encoder kinds clip, siglip)")
    layer = config.get("vision_feature_layer", -2)
    if not isinstance(layer, int):
        raise GraftConfigError(f"{reader.root}: vision_feature_layer={layer!r} concatenates several "
                               "layers; graft encoders select one layer")
    image_processor = _llava_image_processor(reader.root)
    tensors = {_LLAVA_TOWER.sub("", k): reader.get(k)
               for k in reader.keys() if _LLAVA_TOWER.match(k)}
    if not tensors:
        raise GraftConfigError(f"{reader.root}: no vision tower tensors; expected keys like "
                               "'model.vision_tower.embeddings.patch_embedding.weight'")
    arch = {"clip": "CLIPVisionModel", "siglip": "SiglipVisionModel"}[kind]
    vision["architectures"] = [arch]

    _write_encoder_dir(out, tensors, vision, image_processor, reader.root)
    strategy = config.get("vision_feature_select_strategy", "default")
    return {"kind": kind, "path": str(out), "feature_layer": layer,
            "drop_prefix": strategy == "default"}


def extract(donor: str | Path, out: str | Path, part: str = "both",
            target_llm: str | Path | None = None, seed: int = 0) -> dict:
    """Write OUT/vision (an encoder dir) and/or OUT/projector (an adapter dir); returns and
    saves OUT/extract.json with the encoder/adapter spec blocks and the shards read.

    OUT must be new, empty or an earlier extract (it holds extract.json), which is replaced
    whole; any other non-empty dir is refused before the donor is read, as `graft export` does.

    With `target_llm` (an HF LLM dir), the projector's last Linear is re-made (seeded) for
    that LLM's width; the donor's pre-norm and first Linear are kept.
    """
    if part not in PARTS:
        raise GraftConfigError(f"--part {part!r}: use one of {', '.join(PARTS)}")
    from graft.adapters import save_adapter

    donor, out = Path(donor), Path(out)
    config = donor_config(donor)
    check_output_dir(out, SUMMARY)  # before reading any tensor
    d_model = _hidden_size(target_llm) if target_llm is not None and part != "vision" else None
    reader = CheckpointReader(donor)
    summary: dict = {"donor": str(donor), "model_type": config["model_type"], "part": part}
    kimi = config["model_type"] in KIMI_TYPES

    def write(tmp: Path) -> None:  # OUT is built whole, then swapped in: a previous extract
        if part in ("vision", "both"):  # is replaced, never merged with this one
            summary["encoder"] = (_extract_kimi_vision(reader, tmp / "vision") if kimi
                                  else _extract_llava_vision(reader, config, tmp / "vision"))
            summary["encoder"]["path"] = str(out / "vision")
        if part in ("projector", "both"):
            adapter = (kimi_projector_adapter(reader, d_model, seed) if kimi
                       else llava_projector_adapter(reader, config, d_model, seed))
            save_adapter(adapter, tmp / "projector")
            summary["adapter"] = {**adapter.config.to_dict(), "path": str(out / "projector"),
                                  "d_vision": adapter.d_vision, "d_model": adapter.d_model}
            if target_llm is not None:
                summary["adapter"]["seeded_for"] = str(target_llm)
        summary["shards_read"] = sorted(reader.opened)
        atomic_write_json(tmp / SUMMARY, summary)

    write_dir_atomically(out, write, SUMMARY)
    return summary


def _hidden_size(llm_dir: str | Path) -> int:
    path = Path(llm_dir) / "config.json"
    if not path.is_file():
        raise GraftConfigError(f"--target-llm {llm_dir}: no config.json; give a local HF LLM dir")
    config = json.loads(path.read_text())
    config = config.get("text_config", config)
    if not isinstance(config.get("hidden_size"), int):
        raise GraftConfigError(f"--target-llm {path}: no integer hidden_size")
    return config["hidden_size"]
