"""The engine's side of a GGUF-backed LLM dir (graft.gguf_llm): its tensors under HF's names,
each dequantized and un-permuted as transformers does when read (graft.gguf_file), and the
quantization that holds them as the file does (file_scheme): a linear whose GGUF blocks are
Q4_0 or Q4_1 (every part of it, for packed q|k|v and gate|up) in int4-g32, the same grid, read
straight from the blocks (load_file_blocks), and so is one in Q4_K (its scales rounded to
fp16); one in Q8_0, Q5_0 or Q6_K in int8-g32 or int8-g16, exactly; each expert of a MoE layer
whose stacked experts are in such blocks; every other linear in `default`."""

from __future__ import annotations

import logging
from pathlib import Path

from graft.gguf_file import INT8_BLOCKS, Q4_BLOCKS, Q4_NEAR, GGUFFile, processed, tensor_processor
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
        held = self._held_rows(gguf, INT4) if kind in Q4_BLOCKS else None
        if held is not None:
            packed, scale, low = held
            lead = packed.shape[:-1]
            flat = QuantizedWeight(INT4, packed.reshape(-1, packed.shape[-1]),
                                   scale.reshape(-1, scale.shape[-1]), low.reshape(-1, low.shape[-1]))
            return flat.dequantize().reshape(*lead, -1)
        values = processed(self.processor, dequantize(self.file.raw(gguf), GGMLQuantizationType[kind]), gguf)
        return torch.from_numpy(values if values.flags.writeable else np.copy(values))

    def _held_rows(self, gguf: str, scheme: QuantScheme):
        """One GGUF tensor in `scheme`'s canonical tensors straight from its blocks
        (GGUFFile.q4_int4 or q8_int8; int8-g16 takes a G = 32 type's scales twice), its rows
        moved as transformers moves them (its processor run on row numbers: Llama's q/k); None
        where a scale does not fit."""
        import numpy as np
        import torch

        if scheme.kind == "int4":
            held = self.file.q4_int4(gguf)
        else:
            held, group = self.file.q8_int8(gguf), INT8_BLOCKS[self.file.tensors[gguf][0]]
            if held is not None and group != scheme.group_size:
                held = held[0], held[1].repeat_interleave(group // scheme.group_size, dim=-1)
        if held is None or held[0].dim() != 2:
            return held
        rows = processed(self.processor, np.arange(len(held[0]))[:, None], gguf)[:, 0]
        if (rows != np.arange(len(held[0]))).any():
            rows = torch.from_numpy(rows)
            held = tuple(t[rows] for t in held)
        return held

    def blocks(self, names: list[str], scheme: QuantScheme):
        """HF weights `names` (q, k, v of one packed linear, in order) stacked along their rows
        in `scheme`'s canonical tensors (file_scheme of their types) straight from their
        blocks, never widened: the values HF dequantizes (Q4_K: to fp16 rounding of its
        scales); None if a scale does not fit. A MoE layer's experts keep their leading dim."""
        import torch

        parts = []
        for name in names:
            for gguf in self._gguf[name]:
                held = self._held_rows(gguf, scheme)
                if held is None:
                    return None
                parts.append(held)
        return tuple(torch.cat(p, dim=-2) if len(p) > 1 else p[0].contiguous() for p in zip(*parts))


def _reads(asked: QuantScheme | None, own: QuantScheme | None) -> bool:
    """Whether a weight planned in `asked` is read straight from blocks whose own scheme is
    `own`: int4-g32 (with or without -a8) from Q4 blocks; int8-gG from int8 blocks of G or a
    multiple of it (each scale repeated)."""
    if asked is None or own is None or asked.kind != own.kind:
        return False
    if asked.kind == "int4":
        return asked.group_size == own.group_size
    return asked.group_size > 0 and own.group_size % asked.group_size == 0


def file_scheme(kinds) -> QuantScheme | None:
    """The scheme that holds weights stored in GGUF block types `kinds` as the file does:
    int4-g32 for Q4_0/Q4_1 (exact) and Q4_K (scales to fp16); int8-gG for Q8_0/Q5_0 (G = 32)
    and Q6_K (G = 16; a Q8_0 part beside a Q6_K one takes each scale twice), exact; None for
    any other type, or a mix of the two families."""
    kinds = set(kinds)
    if kinds and kinds <= {*Q4_BLOCKS, *Q4_NEAR}:
        return INT4
    if kinds and kinds <= set(INT8_BLOCKS):
        return QuantScheme("int8", min(INT8_BLOCKS[k] for k in kinds))
    return None


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


def load_file_blocks(model, tensors: GGUFTensors, plan: dict, map_name) -> tuple[set[str], set[str]]:
    """Give every linear `plan` holds in the scheme that is its file blocks' own (file_scheme:
    int4-g32 for Q4_0/Q4_1/Q4_K, int8-gG for Q8_0/Q5_0/Q6_K) its weight straight from them, the
    dense weight never made. Returns (those weights' parameter names, the HF names wholly read
    so: what load_weights skips). `map_name`: HF name -> (the model's, packed shard or None)."""
    held, read = set(), set()
    parts: dict[str, dict[int, str]] = {}
    table, table_weights = None, None  # the embedding's HF name; its blocks' form, once read
    tied = "lm_head" in plan and getattr(model, "lm_head", "") is None
    for name in tensors.keys():
        scheme = file_scheme(tensors.kinds(name))
        if scheme is None:
            continue
        experts = _expert_linears(name, plan)
        if experts and all(_reads(plan[m], scheme) for m in experts.values()):
            weights = tensors.blocks([name], plan[experts[0]])
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
        if not shards or module == EMBEDDING:
            continue
        names = [shards[i] for i in sorted(shards)]
        if not _reads(scheme, file_scheme(k for n in names for k in tensors.kinds(n))):
            continue  # another scheme asked for, or a packed linear of mixed types: after loading
        linear = None if module == "lm_head" and tied else model.get_submodule(module)
        if len(shards) != len(getattr(linear, "shard_sizes", [0])):
            continue  # a packed linear with a part in another type: quantized after loading
        weights = tensors.blocks(names, scheme)
        if weights is None:
            continue  # a scale that does not fit: quantized after loading, as any other weight
        if linear is None:  # a tied head: the table's blocks (the lookups' below)
            model.head_quantized = QuantizedWeight(scheme, *weights)
            table_weights = weights
        else:
            linear.hold(QuantizedWeight(scheme, *weights))
            held.add(f"{module}.weight")
            read.update(shards.values())
    scheme = plan.get(EMBEDDING)
    if table is not None and _reads(scheme, file_scheme(tensors.kinds(table))):
        if table_weights is not None and plan["lm_head"] == scheme:  # the tied head itself:
            weights, held_as = table_weights, model.head_quantized   # its C layout, once packed,
        else:                                                        # serves the lookups too
            weights = tensors.blocks([table], scheme)
            held_as = None if weights is None else QuantizedWeight(scheme, *weights)
        if weights is not None:
            model.hold_embedding(held_as)
            if model.embed_tokens.weight.is_meta:  # else a tied fp32 head still reads it
                held.add("embed_tokens.weight")
                read.add(table)
    return held, read


def gguf_quantization(model_dir: str | Path, default: str,
                      linears: dict[str, tuple[int, int]]) -> QuantConfig | None:
    """The file's own precision for an LLM dir `graft.gguf_llm` made (None for other dirs, or
    when no linear is in blocks graft holds as they are): each linear of `linears` (the
    engine's names) in its blocks' file_scheme (int4-g32 for Q4_0/Q4_1 exactly and Q4_K with
    scales to fp16; int8-g32 for Q8_0/Q5_0, int8-g16 for Q6_K, exactly), `default` for the
    rest. A tied head is the embedding's; the embedding table in such blocks is held the same
    way (EMBEDDING), as llama.cpp keeps it: its rows are dequantized as they are looked up."""
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
    modules = {name: scheme.name for name, kinds in parts.items()
               if (scheme := file_scheme(kinds)) is not None}
    _say_what_is_widened(file.resolve().name, parts, modules, default)
    if not modules:
        return None
    table = file_scheme(types.get("model.embed_tokens.weight", "F32").split("+"))
    how: dict[str, int] = {}  # "Q6_K in int8-g16 exactly" -> weights
    for name, scheme in sorted(modules.items()):
        for kind in parts[name]:
            key = f"{kind} weights in {scheme}" + (" with their scales rounded to fp16" if kind in Q4_NEAR else " exactly")
            how[key] = how.get(key, 0) + 1
    if table is not None:
        modules[EMBEDDING] = table.name
    config = QuantConfig.parse({"default": default, "modules": modules})
    said = ", ".join(f"{n} {key}" for key, n in how.items())
    return dataclasses.replace(config, source=f"{file.resolve().name}'s {said}, the rest {default}"
                               + (f"; the embedding table in {table.name}" if table else ""))


def _say_what_is_widened(file: str, parts: dict[str, list[str]], held: dict[str, str],
                         default: str) -> None:
    """A warning when linears stored in blocks graft holds no form of (Q5_K, a packed linear
    of Q4_K and Q6_K parts, ...) are widened to `default`: several times the file's bytes."""
    widened = {k for name, kinds in parts.items() if name not in held for k in kinds
               if k not in ("F32", "F16", "BF16")}
    if widened:
        n = sum(name not in held and any(k in widened for k in kinds) for name, kinds in parts.items())
        log.warning("%s: %d linear%s stored in %s %s held in %s (%s, more bytes than the "
                    "file; graft holds Q4_0/Q4_1/Q4_K in int4-g32 and Q8_0/Q5_0/Q6_K in int8-g32/g16 "
                    "as they are, one family per linear); --quantization int8 or int4 holds them "
                    "smaller, requantized", file, n, "" if n == 1 else "s",
                    "/".join(sorted(widened)), "is" if n == 1 else "are", default,
                    "exact" if default == "fp32" else f"rounded to {default}")
