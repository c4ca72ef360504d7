"""A GGUF file's tensor table read straight from its header, each tensor read from the file
only when asked for, and named as transformers names them.

transformers' own reader (load_gguf_checkpoint, what HF's from_pretrained runs for Llama,
Qwen2 and Qwen3) parses every metadata value, the whole vocabulary included, builds gguf-py's
name table once per module of the model, and dequantizes every tensor before returning any:
~13 s and the model's fp32 bytes for SmolLM2-135M. Here the header walk skips what it does
not need, the name table is built once, and each tensor is dequantized (by gguf-py, as
transformers does) and un-permuted (by transformers' own processor) only when read, one at
a time; Q4_0/Q4_1/Q4_K blocks can be read as graft's int4 codes and scales, and Q8_0/Q5_0/Q6_K
ones as its int8 codes and group scales, never widened."""

from __future__ import annotations

import contextlib
import functools
import struct
from pathlib import Path

import numpy as np

_VERSIONS = (2, 3)
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
           10: "<Q", 11: "<q", 12: "<d"}  # GGUF metadata value types of fixed width
_STRING, _ARRAY = 8, 9
Q4_BLOCKS = ("Q4_0", "Q4_1")  # llama.cpp's 32-weight blocks of 4-bit codes, one scale (and min)
# 256-weight superblocks of eight 32-weight sub-blocks, each w = d*sc * code - dmin*m with 6-bit
# sc and m: graft's int4-g32 holds them with d*sc and dmin*m rounded to fp16 (2^-11 relative)
Q4_NEAR = ("Q4_K",)
# blocks of signed codes times one fp32 number each (Q8_0: d; Q6_K: d * sc; Q5_0: d): graft's
# int8-gG holds them exactly, G the weights per scale
INT8_BLOCKS = {"Q8_0": 32, "Q6_K": 16, "Q5_0": 32}


class GGUFFile:
    """`tensors`: {GGUF name: (type name, torch-order shape, byte offset in the file)};
    `metadata`: the scalar and string values (arrays are skipped, kept as their length)."""

    def __init__(self, path: str | Path):
        from gguf import GGMLQuantizationType

        self.path = Path(path)
        self._blob = np.memmap(self.path, mode="r", dtype=np.uint8)
        if bytes(self._blob[:4]) != b"GGUF":
            raise ValueError(f"{self.path.name} does not start with GGUF's magic bytes")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", self._blob, 4)
        if version not in _VERSIONS:
            raise ValueError(f"{self.path.name} is GGUF version {version}; graft reads versions 2 and 3")
        pos, self.metadata = 24, {}
        for _ in range(n_kv):
            key, pos = self._string(pos)
            (kind,) = struct.unpack_from("<I", self._blob, pos)
            self.metadata[key], pos = self._value(pos + 4, kind)
        table = []
        for _ in range(n_tensors):
            name, pos = self._string(pos)
            (n_dims,) = struct.unpack_from("<I", self._blob, pos)
            dims = struct.unpack_from(f"<{n_dims}Q", self._blob, pos + 4)
            kind, offset = struct.unpack_from("<IQ", self._blob, pos + 4 + 8 * n_dims)
            pos += 16 + 8 * n_dims
            table.append((name, kind, tuple(reversed(dims)), offset))  # ggml: fastest dim first
        align = int(self.metadata.get("general.alignment", 32))
        start = -(-pos // align) * align
        self.tensors = {name: (GGMLQuantizationType(kind).name, shape, start + offset)
                        for name, kind, shape, offset in table}
        self.architecture = str(self.metadata["general.architecture"])
        del self._blob  # the header's pages; tensors are read, not mapped (see raw)

    def _string(self, pos: int) -> tuple[str, int]:
        (n,) = struct.unpack_from("<Q", self._blob, pos)
        return bytes(self._blob[pos + 8:pos + 8 + n]).decode("utf-8", "replace"), pos + 8 + n

    def _value(self, pos: int, kind: int):
        if kind in _SCALAR:
            return struct.unpack_from(_SCALAR[kind], self._blob, pos)[0], pos + struct.calcsize(_SCALAR[kind])
        if kind == _STRING:
            return self._string(pos)
        if kind != _ARRAY:
            raise ValueError(f"{self.path.name}: metadata value type {kind} is not GGUF's")
        item, count = struct.unpack_from("<IQ", self._blob, pos)
        pos += 12
        if item in _SCALAR:
            return count, pos + count * struct.calcsize(_SCALAR[item])
        if item != _STRING:  # arrays of arrays
            for _ in range(count):
                _, pos = self._value(pos, item)
            return count, pos
        for _ in range(count):  # a vocabulary, merges: their lengths are the only way on
            (n,) = struct.unpack_from("<Q", self._blob, pos)
            pos += 8 + n
        return count, pos

    def raw(self, name: str) -> np.ndarray:
        """The tensor as gguf-py's reader holds it (F32/F16 values in their shape, blocks as
        uint8 rows of bytes: what gguf.quants.dequantize takes), read into memory of its own:
        a mapped file's pages would count in the process's RSS until it is unmapped (+0.87 GB
        at the peak of a 1.5B Q4_0 load)."""
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quant_shape_to_byte_shape

        kind, shape, start = self.tensors[name]
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
        buf = bytearray(int(np.prod(shape)) // block * size)
        with open(self.path, "rb") as f:
            f.seek(start)
            if f.readinto(buf) != len(buf):
                raise ValueError(f"{self.path.name}: tensor {name} runs past the end of the file")
        data = np.frombuffer(buf, dtype=np.uint8)
        if kind in ("F32", "F16"):
            return data.view(np.float32 if kind == "F32" else np.float16).reshape(shape)
        return data.reshape(quant_shape_to_byte_shape(shape, GGMLQuantizationType[kind]))

    def q4_int4(self, name: str):
        """A Q4_0/Q4_1/Q4_K tensor [..., N, K] (a matrix, or a MoE layer's experts stacked) in
        graft's int4 layout, as torch tensors: (uint8 [..., N, K/2], two columns per byte, low
        nibble first; scale and min fp16 [..., N, K/32]), w = code * scale + min; None where a
        scale or min is beyond fp16."""
        import torch
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        kind, shape, _ = self.tensors[name]
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
        blocks = torch.from_numpy(self.raw(name)).view(-1, shape[-1] // block, size)
        packed, scale, low = (_q4_k if kind == "Q4_K" else _q4_01)(blocks, kind)
        if not (scale.isfinite().all() and low.isfinite().all()):
            return None
        lead = shape[:-1]
        return packed.reshape(*lead, -1), scale.reshape(*lead, -1), low.reshape(*lead, -1)

    def q8_int8(self, name: str):
        """A Q8_0/Q6_K/Q5_0 tensor [..., N, K] in graft's int8-gG form, G = INT8_BLOCKS[type], as
        torch tensors: (int8 codes [..., N, K], fp32 scales [..., N, K/G]), w = code * scale as
        gguf-py computes it; None where a scale is not finite."""
        import torch
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        kind, shape, _ = self.tensors[name]
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
        blocks = self.raw(name).reshape(-1, size)
        codes, scales = _INT8_READERS[kind](blocks)
        if not np.isfinite(scales).all():
            return None
        lead = shape[:-1]
        return (torch.from_numpy(codes).reshape(*lead, shape[-1]),
                torch.from_numpy(scales).reshape(*lead, shape[-1] // INT8_BLOCKS[kind]))


def _q8_0(blocks):
    """Q8_0: fp16 d, 32 int8 codes."""
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    return np.ascontiguousarray(blocks[:, 2:]).view(np.int8), d


def _q6_k(blocks):
    """Q6_K, as gguf-py reads it: 128 bytes of low nibbles, 64 of 2-bit highs, 16 int8 scales,
    fp16 d; code = (low | high << 4) - 32 per weight, d * sc per 16 weights (exact in fp32)."""
    n = blocks.shape[0]
    ql, qh, sc, d = blocks[:, :128], blocks[:, 128:192], blocks[:, 192:208], blocks[:, 208:]
    low = (ql.reshape(n, -1, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & 0x0F
    high = (qh.reshape(n, -1, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 0x03
    codes = (low.reshape(n, -1, 32) | (high.reshape(n, -1, 32) << 4)).astype(np.int8) - np.int8(32)
    scales = d.copy().view(np.float16).astype(np.float32) * sc.copy().view(np.int8).astype(np.float32)
    return codes.reshape(n, 256), scales


def _q5_0(blocks):
    """Q5_0, as gguf-py reads it: fp16 d, 32 high bits (one uint32), 16 bytes of low nibbles
    (weights 0-15 low, 16-31 high); code = (low | high << 4) - 16."""
    n = blocks.shape[0]
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    qh = blocks[:, 2:6].copy().view(np.uint32).reshape(n, 1) >> np.arange(32, dtype=np.uint32).reshape(1, 32)
    low = (blocks[:, 6:].reshape(n, 1, 16) >> np.array([0, 4], dtype=np.uint8).reshape(1, 2, 1)) & 0x0F
    codes = (low.reshape(n, 32) | ((qh & 1).astype(np.uint8) << 4)).astype(np.int8) - np.int8(16)
    return codes, d


_INT8_READERS = {"Q8_0": _q8_0, "Q6_K": _q6_k, "Q5_0": _q5_0}


def _fp16(blocks, at: int):  # the fp16 at byte `at` of each block
    import torch

    return blocks[..., at:at + 2].contiguous().view(torch.float16)[..., 0]


def _q4_01(blocks, kind: str):
    """Q4_0 / Q4_1: a 32-weight block holds weights 0-15 in the low nibbles of its 16 bytes and
    16-31 in the high ones, so graft's byte c (weights 2c, 2c+1) is bytes 2c, 2c+1's low
    nibbles for c < 8, bytes 2c-16, 2c-15's high ones after. Q4_0's w = d (code - 8) has min
    -8d (exact in fp16 but where |d| > 8188), Q4_1 stores d and m."""
    import torch

    scale = _fp16(blocks, 0)
    low = (scale.float() * -8).half() if kind == "Q4_0" else _fp16(blocks, 2)
    even, odd = blocks[..., -16::2], blocks[..., -15::2]
    return torch.cat([(even & 0xF) | (odd << 4), (even >> 4) | (odd & 0xF0)], dim=-1), scale, low


def _q4_k(blocks, _kind: str):
    """Q4_K: d, dmin (fp16), 12 bytes of eight 6-bit (sc, m) pairs (gguf-py's get_scale_min
    layout), 128 bytes of codes: sub-blocks 2i and 2i+1 in the low and high nibbles of bytes
    32i..32i+31. HF's w = (d*sc) * code - dmin*m in fp32; here d*sc and -dmin*m in fp16."""
    import torch

    d, dmin = _fp16(blocks, 0).float()[..., None], _fp16(blocks, 2).float()[..., None]
    lo, hi, mixed = blocks[..., 4:16].unflatten(-1, (3, 4)).unbind(-2)
    sc = torch.cat([lo & 0x3F, (mixed & 0xF) | ((lo >> 2) & 0x30)], dim=-1)
    m = torch.cat([hi & 0x3F, (mixed >> 4) | ((hi >> 2) & 0x30)], dim=-1)
    qs = blocks[..., 16:].unflatten(-1, (4, 1, 32))
    codes = torch.cat([qs & 0xF, qs >> 4], dim=-2).flatten(-3)  # [.., 4, 2, 32]: sub-blocks in order
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed, (d * sc.float()).half(), (-(dmin * m.float())).half()


@contextlib.contextmanager
def _one_name_table():
    """transformers builds gguf-py's name table once per module it walks (~400 for a 30-layer
    model, 5 s); the table depends only on (architecture, layers): built once here."""
    from unittest import mock

    import gguf

    with mock.patch.object(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map)):
        yield


def hf_names(file: GGUFFile, model) -> tuple[dict[str, str], object]:
    """({GGUF name: HF name} for the tensors of `model` (an HF model, on meta), transformers'
    TensorProcessor for the file): transformers' own map, so the names are what HF loads."""
    from transformers.modeling_gguf_pytorch_utils import get_gguf_hf_weights_map

    processor = tensor_processor(file, model.config)
    with _one_name_table():
        names = get_gguf_hf_weights_map(model, processor)
    # a fused MoE weight (experts.gate_up_proj) has no ".weight": its GGUF tensors are keyed bare
    found = {k if k in file.tensors else f"{k}.weight": v for k, v in names.items()}
    return {k: v for k, v in found.items() if k in file.tensors}, processor


def tensor_processor(file: GGUFFile, config):
    """transformers' TensorProcessor for the file's architecture and an HF config."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    return TENSOR_PROCESSORS.get(file.architecture, TensorProcessor)(config=config.to_dict())


def processed(processor, weights: np.ndarray, name: str) -> np.ndarray:
    """What transformers does to a dequantized tensor before loading it (Llama's q/k rows
    un-permuted from llama.cpp's RoPE layout)."""
    return processor.process(weights=weights, name=name, tensor_key_mapping={},
                             parsed_parameters={}).weights
