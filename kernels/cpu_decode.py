"""One C call for every decoder layer of a step (all decode, or with prompt chunks), or for
the whole all-decode step from token ids to logits (kernels/csrc/decode_step_cpu.c), and for
an MoE layer's MLP (moe_cpu.c): filling the descriptors they read (ctypes structs declared,
and checked against the C, in kernels/c_signatures.py) and the calls."""

from __future__ import annotations

import ctypes
from array import array

import torch

from graft.kernels import cpu_ops, cpu_quant
from graft.kernels.c_signatures import (  # noqa: F401
    Dims, LayerDesc, LinearDesc, MoeDesc, PrefillDesc, StepDesc)
from graft.kernels.checks import check_prefill_chunks, slot_out_of_range
from graft.kernels.quant_formats import QuantizedWeight

EMBED_ROWS = -1  # graft_step_t.embed_kind: the table's own rows, of the activations' dtype
EMBED_LAYOUTS = {"fp32": 4, "bf16": 5, "int8": 6, "int4": 7}  # ... rows of a tied head's C layout


def _addr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def embedding_fields(table: torch.Tensor, held: QuantizedWeight | None) -> dict | None:
    """StepDesc's fields of the lookups (embed, vocab, embed_kind, ...): `table`'s rows, or
    `held`'s (the model's embed_quantized: a table held in a weight scheme, canonical, or a
    tied head's C layout once its canonical copy is dropped); None where a tensor is not
    contiguous."""
    if held is None:
        tensors, kind, group = (table, None, None), EMBED_ROWS, 0
    elif not held.tensors():
        p = held.packed["cpu"]
        tensors, kind, group = (p.weight, p.scales, None), EMBED_LAYOUTS[held.scheme.kind], held.scheme.group_size
    else:
        tensors = (held.qweight, held.scales, held.mins)
        kind, group = cpu_quant.kind_code(held.scheme), held.scheme.group_size
    if not all(t is None or t.is_contiguous() for t in tensors):
        return None
    return {"embed": tensors[0].data_ptr(), "vocab": table.shape[0] if held is None else held.shape[0],
            "embed_kind": kind, "embed_group": group, "embed_scales": _addr(tensors[1]),
            "embed_mins": _addr(tensors[2])}


def linear_desc(weight: QuantizedWeight, bias: torch.Tensor | None) -> LinearDesc:
    """The C view of one packed linear (the tensors must outlive the descriptor)."""
    p = cpu_quant.pack(weight)
    kind = weight.scheme.kind
    n, k = weight.shape
    return LinearDesc(cpu_quant.kind_code(weight.scheme), p.weight.data_ptr(), *p.pointers(kind),
                      weight.scheme.group_size, _addr(bias), n, k, p.num_blocks)


def scratch_floats(layers, moes, dims: Dims, tokens: int) -> int:
    return int(cpu_ops._lib().graft_decode_scratch(layers, moes, len(layers), ctypes.byref(dims),
                                                   tokens))


def step_scratch_floats(layers, moes, dims: Dims, tokens: int) -> int:
    return int(cpu_ops._lib().graft_decode_step_scratch(layers, moes, len(layers),
                                                        ctypes.byref(dims), tokens))


def prefill_desc(num_decodes: int, tables: torch.Tensor, cu_seqlens: torch.Tensor,
                 context_lens: torch.Tensor, num_rows: int) -> PrefillDesc:
    """The C view of a step's prompt chunks (rows num_decodes.. of num_rows; int32 contiguous
    tensors that must outlive it), their offsets and lengths checked as the per-op prefill
    attention checks them."""
    check_prefill_chunks(cu_seqlens, context_lens, num_rows - num_decodes)
    return PrefillDesc(num_decodes, context_lens.shape[0], tables.data_ptr(), tables.shape[1],
                       cu_seqlens.data_ptr(), context_lens.data_ptr())


def decode_layers(layers, moes, dims: Dims, h: torch.Tensor, cos: torch.Tensor,
                  sin: torch.Tensor, slots: torch.Tensor, tables: torch.Tensor | None,
                  lens: torch.Tensor | None, scratch: torch.Tensor,
                  prefill: PrefillDesc | None = None) -> torch.Tensor:
    """Run every layer on h [T, hidden] (fp32, contiguous; overwritten with the last MLP
    output); returns the residual stream [T, hidden]. layers: a ctypes array of LayerDesc;
    moes: None (a dense model) or a ctypes array of MoeDesc pointers, None for a dense layer.
    tables, lens: the decode rows' (every row when prefill is None; None when none decode);
    prefill: the prompt chunks after them (prefill_desc)."""
    residual = torch.empty_like(h)
    bad = cpu_ops._lib().graft_decode_layers(
        layers, moes, len(layers), ctypes.byref(dims), h.shape[0], h.data_ptr(),
        residual.data_ptr(), cos.data_ptr(), sin.data_ptr(), slots.data_ptr(), _addr(tables),
        _addr(lens), None if prefill is None else ctypes.byref(prefill), scratch.data_ptr(),
        torch.get_num_threads())
    _raise_for(bad, dims, lambda: max(slots.tolist()))
    return residual


def decode_step(layers, moes, dims: Dims, step: StepDesc, ids: list[int], positions: list[int],
                slots: list[int], tables: list[list[int]], lens: list[int],
                scratch: torch.Tensor) -> torch.Tensor:
    """A whole all-decode step of T sequences (one token each): ids -> logits [T, step.head.n]
    fp32. The metadata come as Python lists (tables padded here); the KV cache is written."""
    width = max(1, max(len(t) for t in tables))
    flat = array("i", [b for t in tables for b in (t + [0] * (width - len(t)))])
    ids_a, pos_a, slots_a, lens_a = (array("q", ids), array("q", positions), array("q", slots),
                                     array("i", lens))
    dims.max_blocks = width
    logits = torch.empty((len(ids), step.head.n), dtype=torch.float32)
    bad = cpu_ops._lib().graft_decode_step(
        layers, moes, len(layers), ctypes.byref(dims), ctypes.byref(step), len(ids),
        ids_a.buffer_info()[0], pos_a.buffer_info()[0], slots_a.buffer_info()[0],
        flat.buffer_info()[0], lens_a.buffer_info()[0], logits.data_ptr(), scratch.data_ptr(),
        torch.get_num_threads())
    if bad == -2:
        raise ValueError(f"decode step: token ids {[t for t in ids if not 0 <= t < step.vocab][:4]} "
                         f"are outside the embedding [0, {step.vocab})")
    if bad == -3:
        raise ValueError(f"decode step: positions {[p for p in positions if not 0 <= p < step.max_pos][:4]} "
                         f"are outside the RoPE tables [0, {step.max_pos}); raise max_model_len")
    _raise_for(bad, dims, lambda: max(slots))
    return logits


def _raise_for(bad: int, dims: Dims, max_slot) -> None:
    """The exception for graft_decode_layers' return code (0: none)."""
    if bad < 0:
        raise MemoryError("decode step (C): no memory for the scratch buffers (attention, activation digits, int4 group sums)")
    if bad:
        layer, what = divmod(bad - 1, 2)
        if what == 0:
            num_slots = dims.num_blocks * dims.block_size
            raise slot_out_of_range(int(max_slot()), num_slots)
        raise ValueError(f"paged attention (layer {layer}): a block_tables row holds block ids outside "
                         f"[0, {dims.num_blocks}) within its context; fix the block table")


def moe_desc(block, keep: list) -> MoeDesc:
    """The C view of an MoEBlock whose experts (and shared experts) are C-layout silu MLPs;
    the ctypes arrays it points at are appended to `keep` (they must outlive it)."""
    gate = block.gate

    def descs(mlps) -> tuple:
        return tuple((LinearDesc * len(mlps))(*(linear_desc(getattr(m, name).quantized,
                                                            getattr(m, name).bias) for m in mlps))
                     for name in ("gate_up_proj", "down_proj"))

    gate_up, down = descs(block.experts)
    shared = descs([block.shared_experts]) if block.shared_experts is not None else None
    keep.extend((gate_up, down, shared))
    return MoeDesc(gate.weight.data_ptr(), _addr(gate.e_score_correction_bias), gate.num_experts,
                   gate.top_k, int(gate.scoring == "sigmoid"), int(gate.norm_topk_prob),
                   gate.n_group, gate.topk_group, gate.routed_scaling_factor,
                   ctypes.addressof(gate_up), ctypes.addressof(down),
                   *(shared[0][0], shared[1][0]) if shared else (LinearDesc(), LinearDesc()))


def moe_block(desc: MoeDesc, x: torch.Tensor, scratch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [T, hidden] fp32, the scratch, grown if it was too small): an MoE layer's MLP of
    x [T, hidden] (fp32, contiguous) in one C call (kernels/csrc/moe_cpu.c)."""
    lib = cpu_ops._lib()
    T, hidden = x.shape
    need = lib.graft_moe_block_scratch(ctypes.byref(desc), hidden, T)
    if scratch.numel() < need:
        scratch = torch.empty(need)
    out = torch.empty_like(x)
    if lib.graft_moe_block(ctypes.byref(desc), hidden, T, x.data_ptr(), out.data_ptr(),
                           scratch.data_ptr(), torch.get_num_threads()):
        raise MemoryError("MoE block (C): no memory for the linears' scratch (int4 group sums)")
    return out, scratch
