"""One C call for every decoder layer of an all-decode step, or for the whole step from token
ids to logits (kernels/csrc/decode_step_cpu.c): filling the descriptors it reads (ctypes
structs declared, and checked against the C, in kernels/c_signatures.py) and the calls."""

from __future__ import annotations

import ctypes
from array import array

import torch

from graft.kernels import cpu_ops, cpu_quant
from graft.kernels.c_signatures import Dims, LayerDesc, LinearDesc, StepDesc  # noqa: F401
from graft.kernels.checks import slot_out_of_range
from graft.kernels.quant_formats import QuantizedWeight

def _addr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def linear_desc(weight: QuantizedWeight, bias: torch.Tensor | None) -> LinearDesc:
    """The C view of one packed linear (the tensors must outlive the descriptor)."""
    p = cpu_quant.pack(weight)
    kind = weight.scheme.kind
    n, k = weight.shape
    return LinearDesc(cpu_quant.KIND_CODES[kind], p.weight.data_ptr(), *p.pointers(kind),
                      weight.scheme.group_size, _addr(bias), n, k, p.num_blocks)


def scratch_floats(dims: Dims, tokens: int) -> int:
    return int(cpu_ops._lib().graft_decode_scratch(ctypes.byref(dims), tokens))


def step_scratch_floats(dims: Dims, tokens: int) -> int:
    return int(cpu_ops._lib().graft_decode_step_scratch(ctypes.byref(dims), tokens))


def decode_layers(layers, dims: Dims, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  slots: torch.Tensor, tables: torch.Tensor, lens: torch.Tensor,
                  scratch: torch.Tensor) -> torch.Tensor:
    """Run every layer on h [T, hidden] (fp32, contiguous; overwritten with the last MLP
    output); returns the residual stream [T, hidden]. layers: a ctypes array of LayerDesc."""
    residual = torch.empty_like(h)
    bad = cpu_ops._lib().graft_decode_layers(
        layers, len(layers), ctypes.byref(dims), h.shape[0], h.data_ptr(), residual.data_ptr(),
        cos.data_ptr(), sin.data_ptr(), slots.data_ptr(), tables.data_ptr(), lens.data_ptr(),
        scratch.data_ptr(), torch.get_num_threads())
    _raise_for(bad, dims, lambda: max(slots.tolist()))
    return residual


def decode_attention(layer: LayerDesc, dims: Dims, h: torch.Tensor, residual: torch.Tensor,
                     first: bool, cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor,
                     tables: torch.Tensor, lens: torch.Tensor, normed: torch.Tensor,
                     scratch: torch.Tensor, index: int) -> None:
    """One layer's attention half on h [T, hidden] (fp32, contiguous): the residual stream
    updated in place (started from h when first), normed [T, hidden] written with the MLP's
    input. index: the layer's number, for errors."""
    bad = cpu_ops._lib().graft_decode_attention(
        ctypes.byref(layer), ctypes.byref(dims), h.shape[0], h.data_ptr(), residual.data_ptr(),
        int(first), cos.data_ptr(), sin.data_ptr(), slots.data_ptr(), tables.data_ptr(),
        lens.data_ptr(), normed.data_ptr(), scratch.data_ptr(), torch.get_num_threads())
    _raise_for(bad + 2 * index if bad > 0 else bad, dims, lambda: max(slots.tolist()))


def decode_step(layers, dims: Dims, step: StepDesc, ids: list[int], positions: list[int],
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
        layers, len(layers), ctypes.byref(dims), ctypes.byref(step), len(ids),
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


def moe_expert_descs(experts) -> tuple:
    """ctypes arrays of the gate_up and down descriptors of every expert (GatedMLPs whose
    linears are quantized), for moe_experts; the packed tensors must outlive them."""
    gate_up = [linear_desc(e.gate_up_proj.quantized, e.gate_up_proj.bias) for e in experts]
    down = [linear_desc(e.down_proj.quantized, e.down_proj.bias) for e in experts]
    return (LinearDesc * len(gate_up))(*gate_up), (LinearDesc * len(down))(*down)


def moe_experts(descs: tuple, ids: list[int], offsets: list[int], xs: torch.Tensor,
                slot_weights: torch.Tensor) -> torch.Tensor:
    """ys [S, hidden] fp32: rows offsets[a] .. offsets[a + 1] of xs [S, hidden] (fp32,
    contiguous) through expert ids[a]'s MLP, each row times its slot_weights entry [S]."""
    ids_a, offs_a = array("q", ids), array("q", offsets)
    down0 = descs[1][0]
    ys = torch.empty((xs.shape[0], down0.n), dtype=torch.float32)
    most = max(b - a for a, b in zip(offsets, offsets[1:]))
    scratch = torch.empty(3 * down0.k * most, dtype=torch.float32)
    if cpu_ops._lib().graft_moe_experts(
            descs[0], descs[1], ids_a.buffer_info()[0], offs_a.buffer_info()[0], len(ids),
            xs.data_ptr(), slot_weights.data_ptr(), ys.data_ptr(), scratch.data_ptr(),
            torch.get_num_threads()):
        raise MemoryError("MoE experts (C): no memory for the linears' scratch (activation digits, int4 group sums)")
    return ys
