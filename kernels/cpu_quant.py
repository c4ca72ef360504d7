"""The C weight-only linears (kernels/csrc/quant_linear_cpu.c) for int8, int4, bf16 and fp32
weights with fp32 activations, and the blocked layout they read.

`pack` turns a QuantizedWeight's canonical tensors into 16-lane output blocks once, at load
time; `quant_linear` has the contract of graft.kernels.quant_formats.quant_linear (the reference).
The library is the one cpu_ops builds: int8/int4 run on AVX-512 VNNI, bf16/fp32 on AVX-512F,
what this CPU lacks on AVX2 + FMA, and without AVX2 a portable loop (`isa()` says which).
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import torch

from graft.kernels import cpu_ops
from graft.kernels.quant_formats import QuantizedWeight

KIND_CODES = {"int8": 0, "int4": 1, "bf16": 2, "fp32": 3}  # quant_linear_cpu.c KIND_*
INT4_A8 = 4  # KIND_INT4_A8: int4's layout, x rounded to 8 bits (kernels/csrc/quant_a8_cpu.c)


def kind_code(scheme) -> int:
    """The C kind of a scheme (KIND_CODES; the -a8 schemes their own)."""
    return INT4_A8 if scheme.act8 else KIND_CODES[scheme.kind]


@dataclass
class CpuPacked:
    weight: torch.Tensor  # blocks of 16 output lanes, a tile's two blocks alternating per step
    scales: torch.Tensor | None  # int8: fp32 [NB*16]; int8-gG: fp32 [NB/2, G, 2, 16]; int4: fp16 bits as int16 [NB/2, G, 4, 16]
    num_blocks: int  # NB, even
    on_huge_pages: bool = False  # moved there by gather_on_huge_pages

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.weight, self.scales) if t is not None]

    def pointers(self, kind: str) -> tuple[int | None, int | None, int | None]:
        """(scale8, scales4, mins4) addresses for the C calls: int4 keeps scales and minimums in
        one tensor [NB/2, G, 4, 16] (scale 0, scale 1, min 0, min 1), mins4 64 bytes on."""
        if kind == "int8":
            return self.scales.data_ptr(), None, None
        if kind == "int4":
            return None, self.scales.data_ptr(), self.scales.data_ptr() + 32 * 2
        return None, None, None


ISA_NAMES = cpu_ops.ISA_NAMES


def isa() -> str:
    """The path graft_quant_linear takes on this machine: 'avx512-amx' (int8, bf16 and int4 in
    groups of 64/128: calls of 8 rows or more on AMX tiles, the rest as 'avx512-vnni'),
    'avx512-vnni' (int8/int4 on VNNI, bf16/fp32 on AVX-512F), 'avx512' (int8/int4 on AVX2),
    'avx2' (every format on AVX2 + FMA) or 'portable'."""
    return ISA_NAMES[cpu_ops._lib().graft_quant_isa()]


@contextlib.contextmanager
def isa_capped(name: str, lib=None):
    """Within the block, run the paths a CPU with at most `name`'s instructions would (what
    GRAFT_CPU_ISA does for a whole process): tests and comparisons of the fallbacks. `lib`:
    another loaded build of the kernels (default: this process's)."""
    if name not in ISA_NAMES:
        raise ValueError(f"isa_capped: {name!r} is not one of {', '.join(ISA_NAMES)}")
    lib = lib or cpu_ops._lib()
    before = lib.graft_quant_isa()
    lib.graft_quant_cap_isa(ISA_NAMES.index(name))
    try:
        yield
    finally:
        lib.graft_quant_cap_isa(before)


@functools.cache
def _bf16_dot_built() -> bool:
    return bool(cpu_ops._lib().graft_quant_bf16_dot_built())  # fixed for the loaded library


def bf16_dot() -> bool:
    """Whether bf16 weights under bf16-valued activations (a bf16 engine's) run on AVX512-BF16
    dot products (kernels/csrc/quant_bf16dot_cpu.c): this build has them and the ISA level
    allows them (avx512-vnni and up; with AMX its tiles take the calls of 8 rows or more).
    Then a bf16 engine's calls pass bf16 rows in and out as they are (graft_quant_bf16_io)."""
    return isa() in ("avx512-vnni", "avx512-amx") and _bf16_dot_built()


def isa_description() -> str:
    """isa() with what runs where, for load logs."""
    dot = "; bf16 x bf16-valued activations on AVX512-BF16" if bf16_dot() else ""
    return {"avx512-amx": "avx512-amx path: int8/bf16/int4-g64+ on AMX tiles from 8 rows, "
                          "int8/int4 on AVX-512 VNNI, bf16/fp32 on AVX-512F; bf16 prefill "
                          "attention on AMX tiles",
            "avx512-vnni": "avx512-vnni path: int8/int4 on AVX-512 VNNI, bf16/fp32 on AVX-512F",
            "avx512": "avx512 path: bf16/fp32 on AVX-512F; int8/int4 on AVX2 + FMA, this CPU has "
                      "no AVX-512 VNNI",
            "avx2": "avx2 path: every format on AVX2 + FMA, this CPU has no AVX-512",
            "portable": "portable path: no AVX2 + FMA on this CPU, every format on the portable loop",
            }[isa()] + dot


def supports(x: torch.Tensor, weight: QuantizedWeight) -> bool:
    return (weight.scheme.kind in KIND_CODES and x.device.type == "cpu"
            and x.dtype in (torch.float32, torch.bfloat16)
            and not (x.requires_grad and torch.is_grad_enabled()) and cpu_ops.available())


def _blocks(t: torch.Tensor, n_pad: int) -> torch.Tensor:
    """[N, C] -> [NB, C, 16]: rows padded with zeros to n_pad, then 16 rows per block."""
    n, c = t.shape
    if n_pad > n:
        t = torch.cat([t, t.new_zeros(n_pad - n, c)])
    return t.reshape(n_pad // 16, 16, c).transpose(1, 2).contiguous()


def _steps(t: torch.Tensor, n_pad: int) -> torch.Tensor:
    """[N, S, W] -> [NB, S, 16, W]: rows padded to n_pad, 16 rows per block, each row a 32-bit
    word of W elements per step (the int8/int4 layouts of quant_vnni_cpu.c, bf16 pairs)."""
    n, steps, width = t.shape
    if n_pad > n:
        t = torch.cat([t, t.new_zeros(n_pad - n, steps, width)])
    return t.reshape(n_pad // 16, 16, steps, width).transpose(1, 2).contiguous()


def _unsteps(t: torch.Tensor, n: int) -> torch.Tensor:
    """Inverse of _steps: [NB, S, 16, W] -> [n, S, W]."""
    return t.transpose(1, 2).reshape(-1, t.shape[1], t.shape[3])[:n]


def _bf16_pairs(bits: torch.Tensor, n_pad: int) -> torch.Tensor:
    """bf16 bits [N, K] (int16) -> column pairs, K padded with 0 to even."""
    n, k = bits.shape
    if k % 2:
        bits = torch.cat([bits, bits.new_zeros(n, 1)], dim=1)
    return _steps(bits.reshape(n, -1, 2), n_pad)


def _int8_steps(q: torch.Tensor, n_pad: int) -> torch.Tensor:
    """int8 q [N, K] -> q + 128 as uint8, K padded with q = 0 to a multiple of 4."""
    n, k = q.shape
    k4 = -(-k // 4) * 4
    u = (q.to(torch.int16) + 128).to(torch.uint8)
    if k4 > k:
        u = torch.cat([u, u.new_full((n, k4 - k), 128)], dim=1)
    return _steps(u.reshape(n, k4 // 4, 4), n_pad)


def _int4_steps(packed: torch.Tensor, n_pad: int) -> torch.Tensor:
    """Canonical int4 bytes [N, K/2] (column 2j low, 2j+1 high) -> steps of 8 columns, byte t
    holding column 8j + t (low nibble) and 8j + 4 + t (high)."""
    n = packed.shape[0]
    q = torch.stack([packed & 0xF, packed >> 4], dim=2).reshape(n, -1, 2, 4)  # [N, K/8, 2, 4]
    return _steps(q[:, :, 0] | (q[:, :, 1] << 4), n_pad)


def _pairs(t: torch.Tensor) -> torch.Tensor:
    """[NB, S, ...] -> [NB/2, S, 2, ...]: the two blocks of a tile alternate per step, so the
    kernels read one sequential stream per tile (two streams ran ~1.5x slower from DRAM)."""
    return t.reshape(t.shape[0] // 2, 2, *t.shape[1:]).transpose(1, 2).contiguous()


def _unpairs(t: torch.Tensor) -> torch.Tensor:
    """Inverse of _pairs."""
    return t.transpose(1, 2).reshape(-1, t.shape[1], *t.shape[3:])


def pack(weight: QuantizedWeight) -> CpuPacked:
    """The C layout of `weight` (cached in weight.packed["cpu"])."""
    if "cpu" in weight.packed:
        return weight.packed["cpu"]
    kind = weight.scheme.kind
    if kind not in KIND_CODES:
        raise ValueError(f"the C quantized linear takes {', '.join(KIND_CODES)}, not {weight.scheme.name}")
    n, _ = weight.shape
    n_pad = -(-n // 32) * 32
    scales = None
    if kind == "int8":
        blocks = _int8_steps(weight.qweight, n_pad)
    elif kind == "int4":
        blocks = _int4_steps(weight.qweight, n_pad)
    elif kind == "bf16":
        blocks = _bf16_pairs(weight.qweight.view(torch.int16), n_pad)
    else:
        blocks = _blocks(weight.qweight, n_pad)
    if kind == "int8" and weight.scheme.group_size:  # per pair and group: block 0's, block 1's
        sc = _blocks(weight.scales.float(), n_pad)  # [NB, G, 16]
        scales = sc.reshape(-1, 2, *sc.shape[1:]).transpose(1, 2).contiguous()  # [NB/2, G, 2, 16]
    elif kind == "int8":
        scales = torch.cat([weight.scales.float(), weight.scales.new_zeros(n_pad - n)]).contiguous()
    elif kind == "int4":  # per pair and group: scale 0, scale 1, min 0, min 1 (one stream)
        sc = _blocks(weight.scales.view(torch.int16), n_pad)  # [NB, G, 16]
        mn = _blocks(weight.mins.view(torch.int16), n_pad)
        g = sc.shape[1]
        scales = torch.cat([sc.reshape(-1, 2, g, 16), mn.reshape(-1, 2, g, 16)], dim=1)
        scales = scales.transpose(1, 2).contiguous()  # [NB/2, G, 4, 16]
    packed = CpuPacked(_pairs(blocks), scales, n_pad // 16)
    weight.packed["cpu"] = packed
    return packed


def _unblocks(t: torch.Tensor, n: int) -> torch.Tensor:
    """Inverse of _blocks: [NB, C, 16] -> [n, C]."""
    return t.transpose(1, 2).reshape(-1, t.shape[1])[:n].contiguous()


def _codes(kind: str, words: torch.Tensor, k: int) -> torch.Tensor:
    """Canonical int8 / int4 qweight rows from their C layout's lane words [rows, steps, 4]
    (int8: q + 128, 4 columns a word; int4: byte t holds column 8j + t low, 8j + 4 + t high)."""
    rows = words.shape[0]
    if kind == "int8":
        return (words.reshape(rows, -1)[:, :k].to(torch.int16) - 128).to(torch.int8)
    q = torch.stack([words & 0xF, words >> 4], dim=2).reshape(rows, k)  # columns in order
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack(weight: QuantizedWeight) -> tuple:
    """The canonical (qweight, scales, zeros) of weight, rebuilt from its C layout."""
    p, kind = weight.packed["cpu"], weight.scheme.kind
    n, k = weight.shape
    if kind == "fp32" and cpu_ops.available():  # each call of the torch linear path: in C
        w = torch.empty(n, k)
        cpu_ops._lib().graft_quant_unpack_fp32(p.weight.data_ptr(), k, n, w.data_ptr(),
                                               torch.get_num_threads())
        return w, None, None
    blocks = _unpairs(p.weight)
    if kind == "int8":
        q = _codes(kind, _unsteps(blocks, n), k)
        if weight.scheme.group_size:
            return q.contiguous(), _unblocks(_unpairs(p.scales), n), None
        return q.contiguous(), p.scales[:n].clone(), None
    if kind == "int4":
        canonical = _codes(kind, _unsteps(blocks, n), k).contiguous()
        both = p.scales.transpose(1, 2)  # [NB/2, 4, G, 16]
        sc, mn = (both[:, i:i + 2].reshape(-1, both.shape[2], 16) for i in (0, 2))  # [NB, G, 16]
        return canonical, _unblocks(sc, n).view(torch.float16), _unblocks(mn, n).view(torch.float16)
    if kind == "bf16":
        return _unsteps(blocks, n).reshape(n, -1)[:, :k].contiguous().view(torch.bfloat16), None, None
    return _unblocks(blocks, n), None, None


def pack_only(weight: QuantizedWeight) -> CpuPacked:
    """pack(weight), then drop the canonical tensors (rebuilt by unpack on demand): one copy
    of each weight in memory."""
    packed = pack(weight)
    weight.drop_canonical(lambda: unpack(weight), lambda ids: layout_rows(weight, ids))
    return packed


def layout_rows(weight: QuantizedWeight, ids: torch.Tensor) -> torch.Tensor:
    """fp32 [len(ids), K]: rows `ids` of dequantize(), read from the weight's C layout (a tied
    head's copy serving the embedding lookups: decode_step_cpu.c reads them the same way),
    with the same operations, so the same bits."""
    from graft.kernels.quant_formats import _dequantize_rows

    p, k, scheme = weight.packed["cpu"], weight.shape[1], weight.scheme
    pair, half, lane = ids // 32, ids // 16 % 2, ids % 16
    if scheme.kind == "fp32":  # [NB/2, K, 2, 16]
        return p.weight.view(-1, k, 2, 16)[pair, :, half, lane]
    if scheme.kind == "bf16":  # column pairs: [NB/2, K2/2, 2, 16, 2]
        words = p.weight.view(torch.int16).view(-1, (k + 1) // 2, 2, 16, 2)
        bits = words[pair, :, half, lane].reshape(len(ids), -1)[:, :k]
        return bits.view(torch.bfloat16).float()
    if scheme.kind == "int8":  # q + 128, 4 columns a lane word: [NB/2, K4/4, 2, 16, 4]
        q = _codes("int8", p.weight.view(-1, -(-k // 4), 2, 16, 4)[pair, :, half, lane], k)
        scales = p.scales[pair, :, half, lane] if scheme.group_size else p.scales[ids]
        return _dequantize_rows(scheme, q, scales, None)
    q = _codes("int4", p.weight.view(-1, k // 8, 2, 16, 4)[pair, :, half, lane], k)  # int4
    both = p.scales[pair, :, :, lane]  # [len, G, 4]: scale 0, scale 1, min 0, min 1
    pick = half[:, None].expand(-1, both.shape[1])
    sc, mn = (both.gather(2, (pick + i)[..., None])[..., 0].view(torch.float16) for i in (0, 2))
    return _dequantize_rows(scheme, q, sc, mn)


def gather_on_huge_pages(weights: list[QuantizedWeight]) -> int:
    """Move the C layouts of `weights` (packed already) into one buffer on 2 MB pages
    (graft.kernels.huge_pages: a decode step streams them, and 4 KB pages cost a TLB miss per
    page); each old tensor is freed as soon as it is copied, and layouts moved before are left
    where they are. Returns the bytes moved. Descriptors that hold the old addresses
    (FusedDecode) must be built afterwards."""
    from graft.kernels import huge_pages

    layouts = (w.packed.get("cpu") for w in weights)
    packs = list({id(p): p for p in layouts if p is not None and not p.on_huge_pages}.values())
    owners = [(p, name) for p in packs for name in ("weight", "scales") if getattr(p, name) is not None]
    if not owners:
        return 0
    moved = huge_pages.gather([getattr(p, name).contiguous() for p, name in owners],
                              place=lambda i, t: setattr(*owners[i], t))
    for p in packs:
        p.on_huge_pages = True
    return sum(t.numel() * t.element_size() for t in moved)


def quant_linear(x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None = None,
                 portable: bool = False) -> torch.Tensor:
    """Same contract as graft.kernels.quant_formats.quant_linear, for fp32 or bf16 CPU x. portable=True runs
    the scalar loop instead of the vector path (for tests)."""
    from graft.kernels import quant_formats as quant

    if not supports(x, weight):
        return quant.quant_linear(x, weight, bias)
    if (x.dtype == torch.bfloat16 and weight.scheme.kind == "bf16" and not portable
            and bf16_dot()):
        return _bf16_io(x, weight, bias)
    if x.dtype != torch.float32 or (bias is not None and bias.dtype != torch.float32):
        # the reference's contract: fp32 products, the result in x's dtype
        out = quant_linear(x.float(), weight, None if bias is None else bias.float(), portable)
        return out.to(x.dtype)
    n, k = weight.shape
    lead, x2 = _rows(x, k)
    p = pack(weight)
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=torch.float32)
    if rows:
        lib = cpu_ops._lib()
        bias_c = None if bias is None else bias.contiguous()
        args = [kind_code(weight.scheme), x2.data_ptr(), x2.stride(0), rows, k, p.weight.data_ptr(),
                *p.pointers(weight.scheme.kind), weight.scheme.group_size,
                None if bias_c is None else bias_c.data_ptr(), y.data_ptr(), n, n]
        if portable:
            lib.graft_quant_linear_portable(*args, torch.get_num_threads())
        elif lib.graft_quant_linear(*args, p.num_blocks, torch.get_num_threads()):
            raise MemoryError(f"quant_linear (C): no memory for the scratch of {rows} rows (activation digits or bytes, int4 group sums)")
    return y.reshape(*lead, n)


def _bf16_io(x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None) -> torch.Tensor:
    """bf16 x through bf16 weights on the AVX512-BF16 dot products (or AMX tiles), bf16 out:
    the fp32 route's numbers (x.float(), the C linear, .to(bfloat16)) without its two
    conversions."""
    n, k = weight.shape
    lead, x2 = _rows(x, k)
    p = pack(weight)
    y = torch.empty((x2.shape[0], n), dtype=torch.bfloat16)
    bias_c = None if bias is None else bias.float().contiguous()
    if x2.shape[0] and cpu_ops._lib().graft_quant_bf16_io(
            x2.data_ptr(), x2.stride(0), x2.shape[0], k, p.weight.data_ptr(),
            None if bias_c is None else bias_c.data_ptr(), y.data_ptr(), n, n, p.num_blocks,
            torch.get_num_threads()):
        raise MemoryError(f"quant_linear (C): no memory for the scratch of {x2.shape[0]} rows")
    return y.reshape(*lead, n)


def _rows(x: torch.Tensor, k: int) -> tuple[torch.Size, torch.Tensor]:
    """(x's leading shape, x as [rows, k] with unit column stride), or a ValueError when x's
    last dim is not the weight's input size."""
    if x.shape[-1] != k:
        raise ValueError(f"quant_linear: x has {x.shape[-1]} input features, the weight takes {k}")
    x2 = x.reshape(-1, k)
    return x.shape[:-1], x2 if x2.stride(1) == 1 else x2.contiguous()
