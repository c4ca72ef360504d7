"""`graft bench linear-micro` (or `python -m graft.benchmarks.linear_micro`): graft's C
weight-only linear (graft_quant_linear) alone, per weight format, shape and row count, in
G multiply-adds/s and GB/s of weights read. `graft bench linears` ranks whole CPU paths on a
model's layer; this one isolates the kernel's inner loop (the C function called directly, no
Python wrapper per call) so a change to it shows in one process, before against after.

By default the weights stay cache-hot (the same weight every call: the kernel's compute
rate); --cold rotates over copies filling --cold-mb so every call streams from memory. One
thread unless --threads: the engine runs its linears on all its threads, which share the
memory bandwidth.
--baseline-lib PATH also times the same calls in another build of the kernels (say, one
compiled from an older commit's kernels/csrc) in the same process, and prints new / old.
--torch times torch's oneDNN-prepacked linear on the same weights beside (the engine's
`--quantization none`), and prints torch's time over graft's. --bf16-rows feeds bf16 weights
bf16 rows and takes bf16 out (graft_quant_bf16_io, a `--dtype bfloat16` engine's calls; torch
then runs its bf16 linear). Writes JSON.
"""

from __future__ import annotations

import argparse
import sys
import time

from graft.benchmarks.cli_args import int_list, out_file, positive, positive_int
from graft.errors import GraftConfigError

DEFAULT_SHAPES = "1024x512,512x1024,576x1536,1536x576"  # out x in: MoE experts, SmolLM2 MLP


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--formats", default="int8,int4,fp32,bf16",
                        help="weight schemes (int8[-gG], int4[-gG], bf16, fp32), comma-separated")
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help="OUTxIN weight shapes, comma-separated")
    parser.add_argument("--rows", type=int_list, default="1,4,8,32",
                        help="activation rows, comma-separated")
    parser.add_argument("--isa", default=None,
                        help="cap the C path (avx2, avx512, ...; default: this CPU's own)")
    parser.add_argument("--min-seconds", type=positive, default=0.05,
                        help="time per measurement; the best of --repeats is kept")
    parser.add_argument("--repeats", type=positive_int, default=5,
                        help="measurements per case (best kept)")
    parser.add_argument("--cold", action="store_true",
                        help="rotate over weight copies filling --cold-mb (from memory, not cache)")
    parser.add_argument("--cold-mb", type=positive, default=128.0, help="bytes of copies with --cold")
    parser.add_argument("--threads", type=positive_int, default=1,
                        help="threads of each call (the engine's linears run on all its threads)")
    parser.add_argument("--baseline-lib", default=None,
                        help="a .so of the C kernels built from other sources, timed beside")
    parser.add_argument("--torch", action="store_true",
                        help="also time torch's oneDNN-prepacked linear on the same weights (fp32 on "
                             "the dequantized weight; bf16 with --bf16-rows)")
    parser.add_argument("--bf16-rows", action="store_true",
                        help="bf16 weights: bf16 rows in and out (a bf16 engine's calls); others keep fp32 rows")
    parser.add_argument("--out", type=out_file, default=None,
                        help="write the JSON result here (an existing file is replaced)")


def _parse_shapes(text: str) -> list[tuple[int, int]]:
    shapes = []
    for item in text.split(","):
        out, sep, inp = item.strip().lower().partition("x")
        if not (sep and out.isdigit() and inp.isdigit() and int(out) > 0 and int(inp) > 0):
            raise GraftConfigError(f"--shapes: {item!r} is not OUTxIN (e.g. 1024x512)")
        shapes.append((int(out), int(inp)))
    return shapes


def _call_args(cpu_quant, weight, x, y, threads: int):
    """The argument list of graft_quant_linear for x @ weight^T into y (no bias); with bf16
    rows, of graft_quant_bf16_io."""
    p = cpu_quant.pack(weight)
    n, k = weight.shape
    if x.element_size() == 4:  # fp32 rows
        return [cpu_quant.kind_code(weight.scheme), x.data_ptr(), x.stride(0), x.shape[0], k,
                p.weight.data_ptr(), *p.pointers(weight.scheme.kind), weight.scheme.group_size, None,
                y.data_ptr(), n, n, p.num_blocks, threads]
    return [x.data_ptr(), x.stride(0), x.shape[0], k, p.weight.data_ptr(), None, y.data_ptr(), n, n,
            p.num_blocks, threads]


def _torch_linear(weight, x):
    """torch's oneDNN-prepacked linear of x on weight (dequantized, in x's dtype) as a
    no-argument call, or the reason it cannot run here."""
    from graft.kernels import cpu_linear

    reason = cpu_linear.unavailable_reason(x.dtype)
    if reason:
        return reason
    packed = cpu_linear.pack_weight(weight.dequantize().to(x.dtype))
    return lambda: cpu_linear.packed_linear(x, packed)


def _time(fn, min_seconds: float, repeats: int) -> float:
    """Best seconds per call over `repeats` measurements of at least min_seconds each."""
    n = 1
    while True:  # calibrate: calls per measurement
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        dt = time.perf_counter() - t0
        if dt >= min_seconds / 4 or n >= 1 << 20:
            break
        n *= 2
    per = max(1, int(n * min_seconds / max(dt, 1e-9)))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(per):
            fn()
        best = min(best, (time.perf_counter() - t0) / per)
    return best


def measure(scheme_name: str, out: int, inp: int, rows: int, args, lib, baseline, gen) -> dict:
    import torch

    from graft.kernels import cpu_quant
    from graft.kernels.quant_formats import QuantScheme, quant_linear, quantize

    scheme = QuantScheme.parse(scheme_name, "--formats")
    scheme.check_shape(out, inp, f"--shapes {out}x{inp}")
    w = torch.randn(out, inp, generator=gen) * 0.05
    weight_bytes = out * inp * scheme.bytes_per_weight()
    copies = max(1, int(args.cold_mb * 2**20 / weight_bytes)) if args.cold else 1
    weights = [quantize(w, scheme) for _ in range(copies)]
    x = torch.randn(rows, inp, generator=gen)
    y = torch.empty(rows, out)
    bf16_rows = args.bf16_rows and scheme.kind == "bf16"
    if bf16_rows:
        x, y = x.bfloat16(), y.bfloat16()
    calls = [_call_args(cpu_quant, q, x, y, args.threads) for q in weights]
    row = {"format": scheme.name, "out": out, "in": inp, "rows": rows, "bf16_rows": bf16_rows}
    for label, one_lib in (("baseline", baseline), ("", lib)):
        if one_lib is None:
            continue
        fn = one_lib.graft_quant_bf16_io if bf16_rows else one_lib.graft_quant_linear
        if fn(*calls[0]) > 0 and bf16_rows:
            raise GraftConfigError("--bf16-rows: this build has no bf16-in, bf16-out path (it needs "
                                   "AVX512-BF16); leave --bf16-rows out")
        ref = quant_linear(x, weights[0])
        state = {"i": 0}

        def one():
            state["i"] = (state["i"] + 1) % copies
            fn(*calls[state["i"]])

        sec = _time(one, args.min_seconds, args.repeats)
        prefix = f"{label}_" if label else ""
        row.update({f"{prefix}us": sec * 1e6, f"{prefix}gmac_s": rows * out * inp / sec / 1e9,
                    f"{prefix}weight_gb_s": weight_bytes / sec / 1e9,
                    f"{prefix}max_rel_diff": float((y.float() - ref.float()).abs().max() / ref.float().abs().max())})
    if args.torch:
        call = _torch_linear(weights[0], x)
        if isinstance(call, str):
            row["torch_unavailable"] = call
        else:
            before = torch.get_num_threads()
            torch.set_num_threads(args.threads)  # once, outside the timed calls
            try:
                call()
                row["torch_us"] = _time(call, args.min_seconds, args.repeats) * 1e6
            finally:
                torch.set_num_threads(before)
            row["speedup_vs_torch"] = row["torch_us"] / row["us"]
    if baseline is not None:
        row["speedup_vs_baseline"] = row["baseline_us"] / row["us"]
    return row


def _baseline(path: str | None):
    """The kernels of another build, declared like ours (None without --baseline-lib)."""
    if path is None:
        return None
    import ctypes

    from graft.kernels.c_signatures import bind

    try:
        lib = ctypes.CDLL(path)
        bind(lib)
    except (OSError, AttributeError) as err:
        raise GraftConfigError(f"--baseline-lib: cannot use {path}: {err}; give a .so of "
                               "graft's C kernels (kernels/csrc built with cpu_ops.CFLAGS)") from None
    return lib


def run(args) -> int:
    import contextlib

    import torch

    from graft.kernels import cpu_ops, cpu_quant
    from graft.kernels.quant_formats import QuantScheme, QuantSchemeError

    if not cpu_ops.available():
        print("linear-micro: the C kernels are not available on this machine (no C compiler)")
        return 1
    shapes = _parse_shapes(args.shapes)
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    for fmt in formats:
        try:
            QuantScheme.parse(fmt, "--formats")
        except QuantSchemeError as err:
            raise GraftConfigError(str(err)) from None
    rows = args.rows
    lib = cpu_ops._lib()
    baseline = _baseline(args.baseline_lib)
    gen = torch.Generator().manual_seed(0)
    if args.isa and args.isa not in cpu_quant.ISA_NAMES:
        raise GraftConfigError(f"--isa: {args.isa!r} is not one of {', '.join(cpu_quant.ISA_NAMES)}")
    capped = contextlib.ExitStack()
    if args.isa:  # the baseline build takes the same paths as this one
        for one_lib in filter(None, (lib, baseline)):
            capped.enter_context(cpu_quant.isa_capped(args.isa, one_lib))
    results = []
    with capped, torch.inference_mode():
        path = cpu_quant.isa()
        base_path = None if baseline is None else cpu_quant.ISA_NAMES[baseline.graft_quant_isa()]
        print(f"C path: {path}, {args.threads} thread{'s' if args.threads > 1 else ''}, "
              f"{'cold (from memory)' if args.cold else 'cache-hot'}")
        for fmt in formats:
            for out, inp in shapes:
                for m in rows:
                    try:
                        r = measure(fmt, out, inp, m, args, lib, baseline, gen)
                    except QuantSchemeError as err:  # an int4 group that does not divide IN
                        print(f"  skipped: {err}")
                        break
                    results.append(r)
                    print(f"  {r['format']:9s} {out:5d}x{inp:<5d} rows={m:<3d} {r['us']:9.1f} us "
                          f"{r['gmac_s']:7.2f} GMAC/s {r['weight_gb_s']:7.2f} GB/s  "
                          f"max rel diff {r['max_rel_diff']:.1e}"
                          + (f"  {r['speedup_vs_baseline']:.2f}x baseline ({r['baseline_us']:.1f} us)"
                             if baseline is not None else "")
                          + (f"  {r['speedup_vs_torch']:.2f}x torch ({r['torch_us']:.1f} us)"
                             if "torch_us" in r else f"  torch: {r['torch_unavailable']}"
                             if "torch_unavailable" in r else ""))
    if args.out:
        from graft.io import atomic_write_json

        atomic_write_json(args.out, {"isa": path, "baseline_isa": base_path, "threads": args.threads,
                                     "cold": args.cold, "bf16_rows": args.bf16_rows, "results": results})
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":  # the CLI's parser and its one-line config errors
    from graft.cli import main

    sys.exit(main(["bench", "linear-micro", *sys.argv[1:]]))
