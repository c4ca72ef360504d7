"""One C call for every decoder layer of an all-decode step (kernels/csrc/decode_step_cpu.c):
the descriptors it reads (ctypes structs mirroring the C ones) and the call."""

from __future__ import annotations

import ctypes

import torch

from graft.kernels import cpu_ops, cpu_quant
from graft.kernels.checks import slot_out_of_range
from graft.kernels.quant import QuantizedWeight

_ptr, _i64 = ctypes.c_void_p, ctypes.c_int64


class LinearDesc(ctypes.Structure):
    _fields_ = [("kind", _i64), ("w", _ptr), ("scale8", _ptr), ("scales4", _ptr), ("mins4", _ptr),
                ("group", _i64), ("bias", _ptr), ("n", _i64), ("k", _i64), ("nb", _i64)]


class LayerDesc(ctypes.Structure):
    _fields_ = [("qkv", LinearDesc), ("o", LinearDesc), ("gate_up", LinearDesc), ("down", LinearDesc),
                ("in_norm", _ptr), ("post_norm", _ptr), ("q_norm", _ptr), ("k_norm", _ptr),
                ("k_cache", _ptr), ("v_cache", _ptr), ("k_scale", _ptr), ("v_scale", _ptr)]


class Dims(ctypes.Structure):
    _fields_ = [(name, _i64) for name in ("hidden", "num_heads", "num_kv_heads", "head_dim", "rot",
                                          "inter", "interleaved", "block_size", "num_blocks",
                                          "max_blocks", "cache_dtype")] + \
               [("eps", ctypes.c_float), ("qk_eps", ctypes.c_float), ("scale", ctypes.c_float)]


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
    if bad < 0:
        raise MemoryError("decode step (C): no memory for the scratch buffers (attention, activation digits, int4 group sums)")
    if bad:
        layer, what = divmod(bad - 1, 2)
        if what == 0:
            num_slots = dims.num_blocks * dims.block_size
            raise slot_out_of_range(int(slots.max()), num_slots)
        raise ValueError(f"paged attention (layer {layer}): a block_tables row holds block ids outside "
                         f"[0, {dims.num_blocks}) within its context; fix the block table")
    return residual
