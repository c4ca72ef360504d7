"""The engine's side of a GGUF-backed LLM dir (graft.gguf_llm): its tensors under HF's names,
each dequantized and un-permuted as transformers does when read (graft.gguf_file), and the
quantization that holds them as the file does: a linear whose GGUF blocks are Q4_0 or Q4_1
(every part of it, for packed q|k|v and gate|up) in int4-g32, the same grid, read straight
from the blocks (load_file_int4), and so is one in Q4_K (its scales rounded to fp16), and
each expert of a MoE layer whose stacked experts are in those blocks; every other linear in
`default`."""

from __future__ import annotations

import logging
from pathlib import Path

from graft.gguf_file import Q4_BLOCKS, Q4_NEAR, GGUFFile, processed, tensor_processor
from graft.gguf_llm import gguf_types, gguf_weights
from graft.kernels.quant_formats import QuantizedWeight, QuantScheme
from graft.serving.models.quant_config import EMBEDDING, QuantConfig, engine_module_name

INT4 = QuantScheme.parse("int4-g32")
log = logging.getLogger("graft.serving")


class GGUFTensors:
    """A GGUF file's tensors under HF names, read like a safetensors handle (keys, get_tensor):
    each dequantized and processed as transformers' load_gguf_checkpoint does, but one at a
    time, when asked (graft.gguf_file)."""

    def __init__(self, path: Path, hf_config, names: dict[str, list[str]]):
        """`names`: {HF name: its GGUF tensors (MoE: gate, up)}, transformers' map as the dir
        keeps it (graft.gguf_llm.gguf_tensor_names)."""
        self.file = GGUFFile(path)
        self.processor = tensor_processor(self.file, hf_config)
        self._gguf = names

    def keys(self):
        return list(self._gguf)

    def kinds(self, name: str) -> list[str]:
        return [self.file.tensors[gguf][0] for gguf in self._gguf[name]]

    def get_tensor(self, name: str):
        """The tensor as transformers reads it (a MoE layer's gate and up experts side by side,
        [E, 2I, H]); Q4_0/Q4_1 through their int4 form (the same fp32 values: code * d and -8d
        are exact, Q4_1's + m rounds once, as gguf-py's does)."""
        import torch

        parts = [self._read(gguf) for gguf in self._gguf[name]]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-2)

    def _read(self, gguf: str):
        import numpy as np
        import torch
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        kind = self.file.tensors[gguf][0]
        held = self._int4_rows(gguf) if kind in Q4_BLOCKS else None
        if held is not None:
            packed, scale, low = held
            lead = packed.shape[:-1]
            flat = QuantizedWeight(INT4, packed.reshape(-1, packed.shape[-1]),
                                   scale.reshape(-1, scale.shape[-1]), low.reshape(-1, low.shape[-1]))
            return flat.dequantize().reshape(*lead, -1)
        values = processed(self.processor, dequantize(self.file.raw(gguf), GGMLQuantizationType[kind]), gguf)
        return torch.from_numpy(values if values.flags.writeable else np.copy(values))

    def _int4_rows(self, gguf: str):
        """q4_int4 of one GGUF tensor, its rows moved as transformers moves them (its processor
        run on row numbers: Llama's q/k)."""
        import numpy as np
        import torch

        held = self.file.q4_int4(gguf)
        if held is None or held[0].dim() != 2:
            return held
        packed, scale, low = held
        rows = processed(self.processor, np.arange(len(packed))[:, None], gguf)[:, 0]
        if (rows != np.arange(len(packed))).any():
            rows = torch.from_numpy(rows)
            packed, scale, low = packed[rows], scale[rows], low[rows]
        return packed, scale, low

    def int4(self, names: list[str]):
        """HF weights `names` (Q4_0/Q4_1/Q4_K; q, k, v of one packed linear, in order) stacked
        along their rows in graft's int4-g32 form (packed, scale, min) straight from their
        blocks, never widened: the values HF dequantizes (Q4_K: to fp16 rounding of its
        scales); None if a scale is beyond fp16. A MoE layer's experts keep their leading dim."""
        import torch

        parts = []
        for name in names:
            for gguf in self._gguf[name]:
                held = self._int4_rows(gguf)
                if held is None:
                    return None
                parts.append(held)
        return tuple(torch.cat(p, dim=-2) if len(p) > 1 else p[0].contiguous() for p in zip(*parts))


def _expert_linears(name: str, linears) -> dict[int, str]:
    """{expert: the engine's linear} of transformers' fused MoE weight `name`
    (model.layers.0.mlp.experts.gate_up_proj -> layers.0.mlp.experts.E.gate_up_proj); {} for
    any other weight. `linears`: the engine's linear names (a dict or set)."""
    prefix, _, proj = name.removeprefix("model.").rpartition(".")
    if not prefix.endswith(".experts") or proj not in ("gate_up_proj", "down_proj"):
        return {}
    found: dict[int, str] = {}
    while f"{prefix}.{len(found)}.{proj}" in linears:
        found[len(found)] = f"{prefix}.{len(found)}.{proj}"
    return found


def load_file_int4(model, tensors: GGUFTensors, plan: dict, map_name) -> tuple[set[str], set[str]]:
    """Give every linear `plan` holds in int4 with 32-column groups whose file blocks are all
    Q4_0/Q4_1/Q4_K its weight straight from them (graft's int4-g32 is the same grid; Q4_K's
    scales rounded to fp16), the dense weight never made. Returns (those weights' parameter
    names, the HF names wholly read so: what load_weights skips). `map_name`: HF name -> (the
    model's, packed shard or None)."""
    held, read = set(), set()
    parts: dict[str, dict[int, str]] = {}
    table, table_weights = None, None  # the embedding's HF name; its int4 form, once read
    tied = "lm_head" in plan and getattr(model, "lm_head", "") is None
    for name in tensors.keys():
        if not all(k in Q4_BLOCKS + Q4_NEAR for k in tensors.kinds(name)):
            continue
        experts = _expert_linears(name, plan)
        if experts and all(_int4_g32(plan[m]) for m in experts.values()):
            weights = tensors.int4([name])
            if weights is not None:
                for e, module in experts.items():
                    model.get_submodule(module).hold(
                        QuantizedWeight(plan[module], *(t[e] for t in weights)))
                    held.add(f"{module}.weight")
                read.add(name)
            continue
        if not name.endswith(".weight"):
            continue
        target, shard = map_name(name, model)
        if target == "embed_tokens.weight":
            table = name
        module = "lm_head" if tied and target == "embed_tokens.weight" else target[:-len(".weight")]
        parts.setdefault(module, {})[shard or 0] = name
    for module, scheme in plan.items():
        shards = parts.get(module, {})
        if not _int4_g32(scheme) or not shards or module == EMBEDDING:
            continue
        linear = None if module == "lm_head" and tied else model.get_submodule(module)
        if len(shards) != len(getattr(linear, "shard_sizes", [0])):
            continue  # a packed linear with a part in another type: quantized after loading
        weights = tensors.int4([shards[i] for i in sorted(shards)])
        if weights is None:
            continue  # scales beyond fp16: quantized after loading, as any other weight
        if linear is None:  # a tied head: the table's blocks (the lookups' below)
            model.head_quantized = QuantizedWeight(scheme, *weights)
            table_weights = weights
        else:
            linear.hold(QuantizedWeight(scheme, *weights))
            held.add(f"{module}.weight")
            read.update(shards.values())
    if table is not None and _int4_g32(plan.get(EMBEDDING)):
        weights = table_weights or tensors.int4([table])
        if weights is not None:
            model.hold_embedding(QuantizedWeight(plan[EMBEDDING], *weights))
            if model.embed_tokens.weight.is_meta:  # else a tied fp32 head still reads it
                held.add("embed_tokens.weight")
                read.add(table)
    return held, read


def _int4_g32(scheme) -> bool:
    return scheme is not None and scheme.kind == "int4" and scheme.group_size == 32


def gguf_quantization(model_dir: str | Path, default: str,
                      linears: dict[str, tuple[int, int]]) -> QuantConfig | None:
    """The file's own precision for an LLM dir `graft.gguf_llm` made (None for other dirs, or
    when no linear is in 4-bit blocks): int4-g32 for the linears of `linears` (the engine's
    names) stored in Q4_0/Q4_1 (exact) or Q4_K (scales to fp16), `default` for the rest. A
    tied head is the embedding's; the embedding table in such blocks is held in int4-g32 too
    (EMBEDDING), as llama.cpp keeps it: its rows are dequantized as they are looked up."""
    import dataclasses

    file = gguf_weights(model_dir)
    if file is None:
        return None
    types = gguf_types(model_dir)
    parts: dict[str, list[str]] = {}
    for name, kind in types.items():
        for expert in _expert_linears(name, linears).values():  # a MoE layer's: one per expert
            parts.setdefault(expert, []).extend(kind.split("+"))
        module = engine_module_name(name.removesuffix(".weight"))
        if module == "embed_tokens" and "lm_head.weight" not in types:
            module = "lm_head"
        if name.endswith(".weight") and module in linears:
            parts.setdefault(module, []).extend(kind.split("+"))
    held = sorted(name for name, kinds in parts.items() if all(k in Q4_BLOCKS + Q4_NEAR for k in kinds))
    _say_what_is_widened(file.resolve().name, parts, held, default)
    if not held:
        return None
    table = types.get("model.embed_tokens.weight", "F32").split("+")
    modules = {name: INT4.name for name in held}
    if all(k in Q4_BLOCKS + Q4_NEAR for k in table):
        modules[EMBEDDING] = INT4.name

    def count(kinds: tuple[str, ...]) -> str:
        return ", ".join(f"{sum(ks.count(k) for name, ks in parts.items() if name in held)} {k}"
                         for k in kinds if any(k in parts[name] for name in held))

    exact, near = count(Q4_BLOCKS), count(Q4_NEAR)
    how = ", ".join(filter(None, [exact and f"{exact} weights in {INT4.name} exactly",
                                  near and f"{near} weights in {INT4.name} with their scales "
                                  "rounded to fp16"]))
    config = QuantConfig.parse({"default": default, "modules": modules})
    return dataclasses.replace(config, source=f"{file.resolve().name}'s {how}, the rest {default}"
                               + (f"; the embedding table in {INT4.name}" if EMBEDDING in modules else ""))


def _say_what_is_widened(file: str, parts: dict[str, list[str]], exact: list[str],
                         default: str) -> None:
    """A warning when linears stored in blocks graft holds no 4-bit form of (Q8_0, Q6_K, ...)
    are widened to `default`: several times the file's bytes, silently."""
    widened = {k for name, kinds in parts.items() if name not in exact for k in kinds
               if k not in ("F32", "F16", "BF16")}
    if widened:
        n = sum(name not in exact and any(k in widened for k in kinds) for name, kinds in parts.items())
        log.warning("%s: %d linear%s stored in %s %s held in %s (%s, more bytes than the "
                    "file; graft holds only Q4_0/Q4_1/Q4_K as they are); --quantization int8 or int4 "
                    "holds them smaller, requantized", file, n, "" if n == 1 else "s",
                    "/".join(sorted(widened)), "is" if n == 1 else "are", default,
                    "exact" if default == "fp32" else f"rounded to {default}")
