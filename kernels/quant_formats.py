"""Weight formats for the frozen LLM's linears, and their dequantize-then-matmul references.

A scheme says how one weight [out, in] is held in memory:
- fp32: as loaded;  bf16: rounded to bfloat16;
- int8: symmetric per output channel, w = q * scale[o], q in [-127, 127];
- int8-gG (G = 16 or 32): symmetric per group of G input columns, w = q * scale[o, g], the scale
  in fp32 (llama.cpp's Q8_0 at G = 32 and Q6_K at G = 16 come back exact: d and d * sc are
  fp32 numbers, and gguf-py dequantizes as q * scale too);
- int4-gG (G = 32, 64 or 128): asymmetric per group of G input columns,
  w = q * scale[o, g] + min[o, g], q in [0, 15], scale and min in fp16 (llama.cpp's Q4_1
  form: a weight already on such a grid, e.g. dequantized from a Q4_1 GGUF, comes back exact).

Activations stay in the engine's dtype: every product is w(dequantized) * x, so a quantized
linear equals F.linear on the dequantized weight up to float summation order. That is the
parity contract (HF transformers running the same dequantized weights).

One scheme family gives that up on purpose: int4-gG-a8 (llama.cpp's q4 x q8 dot product)
rounds each row of x to int8 per block of 32 columns before the int4 linear (round_activations),
so a CPU without AVX-512 multiplies in integers (kernels/csrc/quant_a8_cpu.c). Its reference
is the dequantized weight times the rounded x: HF matches it with the same rounding as a hook
on each such linear's input (serving.models.quant_config.dequantize_hf_model).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

KINDS = ("fp32", "bf16", "int8", "int4")
INT4_GROUPS = (32, 64, 128)
INT8_GROUPS = (16, 32)  # Q6_K's 16-weight sub-blocks and Q8_0's 32-weight blocks
DEFAULT_INT4_GROUP = 32  # llama.cpp's Q4 group: the best quality of the three on small models
ACT_BLOCK = 32  # columns of x per int8 scale in the -a8 schemes (llama.cpp's q8 block)
SCHEME_NAMES = ("fp32", "bf16", "int8", *(f"int8-g{g}" for g in INT8_GROUPS), "int4",
                *(f"int4-g{g}" for g in INT4_GROUPS),
                "int4-a8", *(f"int4-g{g}-a8" for g in INT4_GROUPS))


class QuantSchemeError(ValueError):
    """A scheme string or a weight shape a scheme cannot take."""


@dataclass(frozen=True)
class QuantScheme:
    kind: str  # one of KINDS
    group_size: int = 0  # int4; int8-gG (0: int8 per output channel)
    act8: bool = False  # int4 only: x rounded to int8 per ACT_BLOCK columns first (round_activations)

    @classmethod
    def parse(cls, text: str, where: str = "scheme") -> "QuantScheme":
        name = str(text).strip().lower()
        base, act8 = (name[:-3], True) if name.endswith("-a8") else (name, False)
        if base == "int4":
            return cls("int4", DEFAULT_INT4_GROUP, act8)
        if base.startswith("int4-g") and base[6:].isdigit() and int(base[6:]) in INT4_GROUPS:
            return cls("int4", int(base[6:]), act8)
        if name.startswith("int8-g") and name[6:].isdigit() and int(name[6:]) in INT8_GROUPS:
            return cls("int8", int(name[6:]))
        if name in ("fp32", "bf16", "int8"):
            return cls(name)
        raise QuantSchemeError(f"{where}={text!r} is not a weight scheme; valid: {', '.join(SCHEME_NAMES)}")

    @property
    def name(self) -> str:
        if self.kind == "int8" and self.group_size:
            return f"int8-g{self.group_size}"
        if self.kind != "int4":
            return self.kind
        return f"int4-g{self.group_size}" + ("-a8" if self.act8 else "")

    def check_shape(self, out_features: int, in_features: int, where: str) -> None:
        if self.kind == "int8" and self.group_size and in_features % self.group_size:
            raise QuantSchemeError(
                f"{where}: int8 group size {self.group_size} does not divide the layer's input width "
                f"{in_features}; use int8 (one scale per output channel)")
        if self.kind == "int4" and in_features % self.group_size:
            raise QuantSchemeError(
                f"{where}: int4 group size {self.group_size} does not divide the layer's input width "
                f"{in_features}; use a group size that does ({', '.join(f'int4-g{g}' + ('-a8' if self.act8 else '') for g in INT4_GROUPS if in_features % g == 0) or 'none fits: use int8'})")

    def bytes_per_weight(self) -> float:
        if self.kind == "int8" and self.group_size:
            return 1.0 + 4.0 / self.group_size
        return {"fp32": 4.0, "bf16": 2.0, "int8": 1.0}.get(self.kind, 0.5 + 4.0 / max(self.group_size, 1))


@dataclass
class QuantizedWeight:
    """A weight [out, in] in one scheme; `packed` holds a backend's own layout, built once.

    The canonical tensors may be dropped once a backend layout exists (drop_canonical): they
    are then rebuilt from it on first use (the reference path, or another device's kernel)."""

    scheme: QuantScheme
    _qweight: torch.Tensor | None  # bf16/fp32/int8 [N, K] | int4: uint8 [N, K/2], low nibble = even k
    _scales: torch.Tensor | None = None  # int8: fp32 [N]; int8-gG: fp32 [N, K/G]; int4: fp16 [N, K/G]
    _mins: torch.Tensor | None = None  # int4: fp16 [N, K/G]
    packed: dict = field(default_factory=dict)  # backend name -> its layout (graft.kernels.cpu_quant)
    shape: tuple[int, int] = (0, 0)  # (out, in)
    _restore: object = None  # () -> (qweight, scales, mins), set by drop_canonical
    _rows: object = None  # ids -> rows(ids) from a backend layout, set by drop_canonical

    def __post_init__(self) -> None:
        if self._qweight is not None:
            n, k = self._qweight.shape
            self.shape = (n, k * 2) if self.scheme.kind == "int4" else (n, k)

    def _canonical(self, keep: bool = True) -> tuple:
        if self._qweight is None:
            if not keep:  # rebuilt for one use: the backend layout stays the only copy
                return self._restore()
            self._qweight, self._scales, self._mins = self._restore()
            self._restore = self._rows = None
        return self._qweight, self._scales, self._mins

    @property
    def qweight(self) -> torch.Tensor:
        return self._canonical()[0]

    @property
    def scales(self) -> torch.Tensor | None:
        return self._canonical()[1]

    @property
    def mins(self) -> torch.Tensor | None:
        return self._canonical()[2]

    def drop_canonical(self, restore, rows=None) -> None:
        """Free the canonical tensors; `restore()` rebuilds them (from a backend layout), and
        `rows(ids)`, when given, reads rows from that layout without rebuilding the rest."""
        self._qweight = self._scales = self._mins = None
        self._restore, self._rows = restore, rows

    def tensors(self) -> list[torch.Tensor]:
        """The canonical tensors currently held (none after drop_canonical)."""
        return [t for t in (self._qweight, self._scales, self._mins) if t is not None]

    def nbytes(self) -> int:
        """Bytes of the canonical format (whether or not it is held right now)."""
        return sum(t.numel() * t.element_size() for t in (self.qweight, self.scales, self.mins)
                   if t is not None)

    def read_bytes(self) -> int:
        """Bytes one matmul reads: a backend's packed layout when there is one, else the canonical."""
        layouts = [sum(t.numel() * t.element_size() for t in p.tensors()) for p in self.packed.values()]
        return min(layouts) if layouts else self.nbytes()

    def dequantize(self, keep: bool = True) -> torch.Tensor:
        """fp32 [N, K]: the weight every kernel of this scheme multiplies by. keep=False:
        canonical tensors rebuilt from a backend layout are not kept (one call's use)."""
        return _dequantize_rows(self.scheme, *self._canonical(keep))

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """fp32 [len(ids), K]: rows `ids` of dequantize(), the same bits (an embedding table's
        lookups: a held table's canonical tensors, or a tied head's backend layout)."""
        if self._qweight is None and self._rows is not None:
            return self._rows(ids)
        qweight, scales, mins = self._canonical()
        return _dequantize_rows(self.scheme, qweight[ids], None if scales is None else scales[ids],
                                None if mins is None else mins[ids])


def _dequantize_rows(scheme: QuantScheme, qweight: torch.Tensor, scales, mins) -> torch.Tensor:
    """fp32 [N, K] of canonical rows: a product (int8, int4) and a sum (int4), rounded apart."""
    if scheme.kind in ("fp32", "bf16"):
        return qweight.float()
    n, g = qweight.shape[0], scheme.group_size
    if scheme.kind == "int8":
        if not g:
            return qweight.float() * scales.float()[:, None]
        return qweight.float().view(n, -1, g).mul_(scales.float()[..., None]).view(n, -1)
    q = unpack_int4(qweight).float().view(n, -1, g)  # in place: one fp32 [N, K] at a time
    return q.mul_(scales.float()[..., None]).add_(mins.float()[..., None]).view(n, -1)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K/2] (two columns per byte, low nibble first) -> uint8 [N, K] in [0, 15]."""
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(packed.shape[0], -1)


def quantize(weight: torch.Tensor, scheme: QuantScheme) -> QuantizedWeight:
    """Quantize a float weight [out, in] (round to nearest; min-max ranges)."""
    w = weight.detach().float()
    if w.dim() != 2:
        raise QuantSchemeError(f"quantize takes a 2-D weight [out, in], got shape {tuple(w.shape)}")
    scheme.check_shape(*w.shape, where="quantize")
    if scheme.kind == "fp32":
        return QuantizedWeight(scheme, w.contiguous())
    if scheme.kind == "bf16":
        return QuantizedWeight(scheme, w.to(torch.bfloat16).contiguous())
    g = scheme.group_size
    n, k = w.shape
    if scheme.kind == "int8":  # per channel, or per group of g columns (w viewed [N * K/g, g])
        rows = w.reshape(-1, g) if g else w
        scale = rows.abs().amax(dim=1) / 127.0
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        q = torch.round(rows / scale[:, None]).clamp_(-127, 127).to(torch.int8).reshape(n, k)
        return QuantizedWeight(scheme, q.contiguous(), scale.reshape(n, -1).contiguous() if g else scale.contiguous())
    groups = w.reshape(n, k // g, g)
    lo = groups.amin(dim=2).to(torch.float16).float()  # stored in fp16: quantize against that
    hi = groups.amax(dim=2)
    scale = ((hi - lo) / 15.0).clamp(min=6.2e-5).to(torch.float16).float()  # fp16's smallest normal
    q = torch.round((groups - lo[..., None]) / scale[..., None]).clamp_(0, 15)
    if g == 32:
        q, scale, lo = _keep_symmetric_grid(groups, q, scale, lo)
    q = q.to(torch.uint8).reshape(n, k)
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()
    return QuantizedWeight(scheme, packed, scale.to(torch.float16).contiguous(),
                           lo.to(torch.float16).contiguous())


def _keep_symmetric_grid(groups, q, scale, lo):
    """Groups already on llama.cpp's Q4_0 grid (w = d * (j - 8), j in [0, 15]: a Q4_0 GGUF
    dequantized) kept exact where min-max rounding would move them: Q4_0 need not use j = 15,
    so (max - min) / 15 misses d. The largest |w| of such a group is -8d (j = 0), so the
    group is (scale d, min -8d, codes j), both exact in fp16; d < 0 gives a negative scale,
    which every kernel takes (7|d|, the mirrored form's min, is not an fp16 number)."""
    exact = (q * scale[..., None] + lo[..., None] == groups).all(dim=2)
    peak = groups.gather(2, groups.abs().argmax(dim=2, keepdim=True)).squeeze(2)  # -8d
    d = (peak / -8).to(torch.float16).float()
    safe = torch.where(d != 0, d, torch.ones_like(d))
    j = torch.round((groups - peak[..., None]) / safe[..., None]).clamp_(0, 15)
    take = ~exact & (d != 0) & (j * d[..., None] + peak[..., None] == groups).all(dim=2)
    return (torch.where(take[..., None], j, q), torch.where(take, d, scale),
            torch.where(take, peak, lo))


def round_activations(x: torch.Tensor) -> torch.Tensor:
    """x (fp32) rounded to int8 per block of ACT_BLOCK columns of its last dim, as the -a8
    schemes multiply it: d = max|x| / 127, x_hat = round(x * (1 / d)) * d (to nearest even).
    A block holding inf or NaN becomes NaN (so does every output that reads it); one whose d
    would be subnormal (1 / d could overflow) becomes zero."""
    k = x.shape[-1]
    if k % ACT_BLOCK:
        raise QuantSchemeError(f"8-bit activations take rows whose width is a multiple of {ACT_BLOCK}, not {k}")
    blocks = x.float().reshape(*x.shape[:-1], k // ACT_BLOCK, ACT_BLOCK)
    d = blocks.abs().amax(dim=-1, keepdim=True) / 127.0
    inv = torch.where(d >= torch.finfo(torch.float32).tiny, 1.0 / d, torch.zeros_like(d))
    return (torch.round(blocks * inv) * d).reshape(x.shape)


def linear_input(x: torch.Tensor, scheme: QuantScheme) -> torch.Tensor:
    """x in fp32 as a linear of `scheme` multiplies it (rounded for the -a8 schemes)."""
    return round_activations(x) if scheme.act8 else x.float()


def quant_linear(x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., in] @ dequantize(weight).T + bias, computed in fp32 (x rounded first for the -a8
    schemes), returned in x's dtype."""
    n, k = weight.shape
    if x.shape[-1] != k:
        raise ValueError(f"quant_linear: x has {x.shape[-1]} input features, the weight takes {k}")
    out = F.linear(linear_input(x, weight.scheme), weight.dequantize().to(x.device),
                   None if bias is None else bias.float())
    return out.to(x.dtype)
