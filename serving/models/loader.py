"""Load HF safetensors (single file or sharded index), or the GGUF file of an LLM dir
graft.gguf_llm made (its Q4_0/Q4_1/Q4_K linears planned in int4-g32 straight from their blocks),
into our model, packing q|k|v and gate|up (and splitting transformers' fused [E, out, in]
expert tensors per expert)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from torch import nn

from graft.errors import GraftConfigError
from graft.gguf_llm import GGUF_INFO, gguf_tensor_names, gguf_weights
from graft.serving.models.gguf_weights import GGUFTensors, load_file_blocks
from graft.serving.models.layers import PackedLinear
from graft.shards import safetensors_files

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def _weight_files(model_dir: str | Path, hf_config):
    """(file, handle with keys() and get_tensor(name)) per weight file of the dir."""
    gguf = gguf_weights(model_dir)
    if gguf is not None:
        names = gguf_tensor_names(model_dir)
        if not names:
            raise GraftConfigError(f"{model_dir}: its {GGUF_INFO} names no GGUF tensors (not a dir "
                                   "graft made?); give the GGUF file itself (graft serve FILE.gguf)")
        yield gguf, contextlib.nullcontext(GGUFTensors(gguf, hf_config, names))
        return
    from safetensors import safe_open

    for file in safetensors_files(model_dir):
        yield file, safe_open(str(file), framework="pt")


def load_weights(model: nn.Module, model_dir: str | Path, hf_config=None,
                 plan: dict | None = None) -> None:
    """Copy every checkpoint tensor into `model`; error on anything missing or unexpected.
    `hf_config`: the dir's config, which a GGUF-backed dir needs to name its tensors; `plan`
    (module -> QuantScheme): a GGUF's linears it holds in their blocks' own scheme (int4-g32,
    int8-gG) are read as such."""
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for file, opened in _weight_files(model_dir, hf_config):
        with opened as f:
            held, read = (load_file_blocks(model, f, plan or {}, _map_name)
                          if isinstance(f, GGUFTensors) else (set(), set()))
            loaded |= held
            for name in f.keys():
                if name.endswith(_IGNORED_SUFFIXES):
                    continue
                if name == "lm_head.weight" and getattr(model, "tie_word_embeddings", False):
                    continue  # tied: the output projection is the embedding table
                if name in read:
                    continue  # held as the file's int4 blocks
                for target, shard, tensor in _pieces(name, f, model):
                    if target not in params:
                        raise ValueError(f"{file.name}: unexpected tensor {name!r} for "
                                         f"{type(model).__name__}; is config.json the right family?")
                    dest = params[target].data
                    if shard is not None:
                        dest = _packed_module(model, target).shard(dest, shard)
                    if tuple(tensor.shape) != tuple(dest.shape):
                        raise ValueError(f"{file.name}: tensor {name!r} has shape "
                                         f"{tuple(tensor.shape)}, expected {tuple(dest.shape)} "
                                         "from config.json")
                    with torch.no_grad():
                        dest.copy_(tensor)
                    loaded.add(target if shard is None else f"{target}#{shard}")
    missing = []
    for name, module in model.named_modules():
        for pname, _ in module.named_parameters(recurse=False):
            full = f"{name}.{pname}" if name else pname
            if isinstance(module, PackedLinear) and full not in loaded:  # loaded whole or by shard
                missing += [f"{full}#{i}" for i in range(len(module.shard_sizes))
                            if f"{full}#{i}" not in loaded]
            elif full not in loaded:
                missing.append(full)
    if missing:
        raise ValueError(f"{model_dir}: checkpoint lacks {len(missing)} tensors, e.g. {missing[:4]}")


def _pieces(name: str, f, model: nn.Module):
    """(our name, packed shard or None, tensor) for checkpoint tensor `name`. transformers'
    fused expert layout (`save_pretrained(save_original_format=False)`) holds all routed
    experts of a layer in one `mlp.experts.gate_up_proj` [E, 2I, H] (gate rows, then up) or
    `mlp.experts.down_proj` [E, H, I]: one piece per expert, whole into its linear."""
    parts = name.removeprefix("model.").split(".")
    if parts[-2:-1] == ["experts"] and parts[-1] in ("gate_up_proj", "down_proj"):
        fused = f.get_tensor(name)
        prefix = ".".join(parts[:-1])
        return [(f"{prefix}.{e}.{parts[-1]}.weight", None, fused[e]) for e in range(fused.shape[0])]
    return [(*_map_name(name, model), f.get_tensor(name))]


def _map_name(name: str, model: nn.Module) -> tuple[str, int | None]:
    """HF name (model.layers.0.self_attn.q_proj.weight) -> (our name, packed shard or None)."""
    if name.startswith("model."):
        name = name[len("model."):]
    parts = name.split(".")
    if len(parts) >= 2 and parts[-2] in model.packed_names:
        packed, shard = model.packed_names[parts[-2]]
        return ".".join(parts[:-2] + [packed, parts[-1]]), shard
    return name, None


def _packed_module(model: nn.Module, param_name: str) -> PackedLinear:
    return model.get_submodule(param_name.rsplit(".", 1)[0])
