"""Read MoonViT and Kimi projector tensors key by key from Kimi checkpoints.

Understands transformers' Kimi-K2.5 names (`model.vision_tower.layers.N.attn.q_proj`), the
original Kimi-VL / K2.5 release names (`vision_tower.encoder.blocks.N.wqkv`, fused qkv in
complex RoPE order) and our extracted dirs (bare `layers.N...`). Only the shards holding
the requested tensors are opened, so a donor's language model is never read.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from graft.encoders.moonvit_model import MoonViTConfig
from graft.errors import GraftConfigError
from graft.shards import INDEX_NAME, read_weight_map

# Kimi-VL / remote-code config names -> MoonViTConfig fields.
_CONFIG_ALIASES = {
    "init_pos_emb_height": "pos_emb_height", "init_pos_emb_width": "pos_emb_width",
    "vt_hidden_size": "hidden_size", "vt_intermediate_size": "intermediate_size",
    "vt_num_attention_heads": "num_attention_heads", "vt_num_hidden_layers": "num_hidden_layers",
}
_VISION_PREFIX = re.compile(r"^(model\.)?vision_tower\.(encoder\.)?")
_PROJECTOR_PREFIX = re.compile(r"^(model\.)?(mm_projector|multi_modal_projector)\.")
# Projector parts, all layouts -> (pre_norm | linear_1 | linear_2).
_PROJECTOR_NAMES = {"pre_norm": "pre_norm", "in_proj": "linear_1", "proj.0": "linear_1",
                    "linear_1": "linear_1", "out_proj": "linear_2", "proj.2": "linear_2",
                    "linear_2": "linear_2"}


class CheckpointReader:
    """Lazy per-tensor access to a dir of (sharded) safetensors; remembers which files it opened."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        if not self.root.is_dir():
            raise GraftConfigError(f"checkpoint dir {str(self.root)!r} does not exist")
        weight_map = read_weight_map(self.root)
        if weight_map is not None:
            self.weight_map: dict[str, str] = weight_map
        else:
            from safetensors import safe_open

            self.weight_map = {}
            files = sorted(self.root.glob("*.safetensors"))
            if not files:
                raise GraftConfigError(
                    f"{self.root}: no {INDEX_NAME} and no *.safetensors files")
            for f in files:
                with safe_open(str(f), framework="pt") as handle:
                    self.weight_map.update({k: f.name for k in handle.keys()})
        self._handles: dict[str, object] = {}

    @property
    def opened(self) -> set[str]:
        return set(self._handles)

    def keys(self) -> list[str]:
        return list(self.weight_map)

    def get(self, key: str) -> torch.Tensor:
        from safetensors import safe_open

        name = self.weight_map[key]
        if name not in self._handles:
            path = self.root / name
            if not path.is_file():
                raise GraftConfigError(
                    f"{self.root}: tensor {key!r} lives in shard {name}, which is missing")
            self._handles[name] = safe_open(str(path), framework="pt")
        try:
            return self._handles[name].get_tensor(key)
        except Exception as err:  # safetensors' own error type; the index and shard disagree
            raise GraftConfigError(
                f"{self.root}: tensor {key!r} is listed for shard {name} but cannot be read "
                f"from it ({err}); the checkpoint is incomplete or its index is stale") from err


def read_vision_config(root: str | Path) -> tuple[MoonViTConfig, dict]:
    """MoonViTConfig from a K2.5 / Kimi-VL config.json (vision_config) or an extracted dir's."""
    path = Path(root) / "config.json"
    if not path.is_file():
        raise GraftConfigError(f"{root}: no config.json; expected a Kimi-K2.5, Kimi-VL or "
                               "`graft extract` MoonViT directory")
    full = json.loads(path.read_text())
    vision = full.get("vision_config", full)
    if "vision_config" not in full and full.get("model_type") not in ("kimi_k25_vision", "moonvit"):
        raise GraftConfigError(
            f"{path}: model_type={full.get('model_type')!r} has no vision_config; expected a "
            "Kimi-K2.5 (kimi_k25), Kimi-VL (kimi_vl) or extracted MoonViT (kimi_k25_vision) config")
    fields = MoonViTConfig.__dataclass_fields__
    values = {}
    for key, value in vision.items():
        key = _CONFIG_ALIASES.get(key, key)
        if key in fields:
            values[key] = tuple(value) if key == "merge_kernel_size" else value
    theta = (vision.get("rope_parameters") or {}).get("rope_theta")
    if theta is not None:
        values["rope_theta"] = float(theta)
    return MoonViTConfig(**values), full


def _vision_layout(names: dict[str, str]) -> str:
    if any(n.startswith("blocks.") for n in names):
        return "kimi"  # original release: fused wqkv, complex RoPE order
    if any(n.startswith("layers.") for n in names):
        return "hf"
    return ""


def _rope_rows_to_half(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Complex pairs (2i, 2i+1) -> rotate-half pairs (i, i + D/2), per head, on output rows."""
    rows = t.shape[0]
    half = rows // heads // 2
    return t.reshape(heads, half, 2, *t.shape[1:]).transpose(1, 2).reshape(rows, *t.shape[1:])


def _check(key: str, tensor: torch.Tensor, expected: tuple, root) -> torch.Tensor:
    if tuple(tensor.shape) != tuple(expected):
        raise GraftConfigError(
            f"{root}: tensor {key!r} has shape {tuple(tensor.shape)}, expected {tuple(expected)} "
            "from the vision config in config.json; the weights and config do not belong together")
    return tensor


def load_vision_state(reader: CheckpointReader, cfg: MoonViTConfig, expected: dict) -> dict:
    """{our tensor name: tensor} for every name in `expected` (name -> shape)."""
    root = reader.root
    bare = not any(_VISION_PREFIX.match(k) for k in reader.keys())
    names = {}  # normalized name -> checkpoint key
    for key in reader.keys():
        if _VISION_PREFIX.match(key):
            names[_VISION_PREFIX.sub("", key)] = key
        elif bare and not _PROJECTOR_PREFIX.match(key):
            names[key] = key
    layout = _vision_layout(names)
    if not layout:
        raise GraftConfigError(
            f"{root}: no MoonViT vision tower tensors; expected keys like "
            "'vision_tower.encoder.blocks.0.wqkv.weight' (Kimi-VL / K2.5 release) or "
            "'model.vision_tower.layers.0.attn.q_proj.weight' (transformers Kimi-K2.5)")
    out = {}

    def read(name: str) -> torch.Tensor:
        if name not in names:
            raise GraftConfigError(
                f"{root}: missing tensor for {name!r} ({layout} layout); the checkpoint has "
                f"{len(names)} vision tensors, e.g. {sorted(names)[:3]}")
        return reader.get(names[name])

    d = cfg.hidden_size
    for ours, shape in expected.items():
        if layout == "hf":
            out[ours] = _check(names.get(ours, ours), read(ours), shape, root)
            continue
        src, third = _kimi_source(ours)
        tensor = read(src)
        if third is None:
            out[ours] = _check(names[src], tensor, shape, root)
            continue
        _check(names[src], tensor, (3 * d, *shape[1:]), root)
        tensor = tensor[third * d:(third + 1) * d]  # wqkv rows are [q; k; v]
        out[ours] = tensor if third == 2 else _rope_rows_to_half(tensor, cfg.num_attention_heads)
    return out


# Our (transformers) block module names -> Kimi release names; q/k/v live in the fused wqkv.
_KIMI_BLOCK = {"norm1": "norm0", "norm2": "norm1", "mlp.fc1": "mlp.fc0", "mlp.fc2": "mlp.fc1",
               "attn.proj": "wo"}


def _kimi_source(ours: str) -> tuple[str, int | None]:
    """Release-layout name holding our tensor `ours`, and its third of wqkv (q 0, k 1, v 2)."""
    if ours == "patch_embed.pos_emb.position_embeddings":
        return "patch_embed.pos_emb.weight", None
    m = re.match(r"layers\.(\d+)\.(.+)\.(weight|bias)$", ours)
    if m is None:
        return ours, None
    i, module, leaf = m.groups()
    if module in _KIMI_BLOCK:
        return f"blocks.{i}.{_KIMI_BLOCK[module]}.{leaf}", None
    return f"blocks.{i}.wqkv.{leaf}", "qkv".index(module.removeprefix("attn.")[0])


def load_projector_state(reader: CheckpointReader) -> dict:
    """Kimi's projector as {pre_norm|linear_1|linear_2}.{weight|bias} from any Kimi layout."""
    out = {}
    for key in reader.keys():
        if not _PROJECTOR_PREFIX.match(key):
            continue
        rest = _PROJECTOR_PREFIX.sub("", key)
        module, _, leaf = rest.rpartition(".")
        if module in _PROJECTOR_NAMES:
            out[f"{_PROJECTOR_NAMES[module]}.{leaf}"] = reader.get(key)
    needed = [f"{m}.{p}" for m in ("pre_norm", "linear_1", "linear_2") for p in ("weight", "bias")]
    missing = [n for n in needed if n not in out]
    if missing:
        raise GraftConfigError(
            f"{reader.root}: Kimi projector tensors missing: {', '.join(missing)}; expected "
            "'multi_modal_projector.{pre_norm,linear_1,linear_2}' (Kimi-VL) or "
            "'mm_projector.{pre_norm,proj.0,proj.2}' / 'model.mm_projector.{pre_norm,in_proj,"
            "out_proj}' (Kimi-K2.5)")
    d_in = out["linear_1.weight"].shape[1]
    groups = d_in // out["pre_norm.weight"].shape[0] if out["pre_norm.weight"].shape[0] else 0
    if groups * out["pre_norm.weight"].shape[0] != d_in or out["linear_2.weight"].shape[1] != \
            out["linear_1.weight"].shape[0]:
        raise GraftConfigError(
            f"{reader.root}: projector shapes do not chain: pre_norm "
            f"{tuple(out['pre_norm.weight'].shape)}, linear_1 {tuple(out['linear_1.weight'].shape)}, "
            f"linear_2 {tuple(out['linear_2.weight'].shape)}; expected linear_1 input = "
            "pre_norm width x merged patches and linear_2 input = linear_1 output")
    return out
