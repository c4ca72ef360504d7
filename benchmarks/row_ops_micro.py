"""`graft bench row-ops-micro` (or `python -m graft.benchmarks.row_ops_micro`): the decode
step's C kernels besides the linears, alone, on one thread: the paged decode attention (fp32
query and cache), silu(gate) * up and the greedy argmax, each C function called directly.
--baseline-lib PATH times the same calls in another build of the kernels in the same process
(one compiled from an older commit's kernels/csrc, or for another -march) and prints new / old;
the outputs of both are compared too. Writes JSON.

Why: a build for an AVX2 CPU ran the attention 6x slower than the AVX-512 build of the same
sources (GCC kept its 64-byte vectors on the stack), which only a whole-engine run had shown.
"""

from __future__ import annotations

import argparse
import sys

from graft.benchmarks.cli_args import out_file, positive, positive_int
from graft.benchmarks.linear_micro import _baseline, _time


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seqs", type=int, default=32, help="sequences (attention) and rows (silu, argmax)")
    parser.add_argument("--context", type=int, default=192, help="tokens per sequence")
    parser.add_argument("--heads", default="9,3", help="query,kv heads (default: SmolLM2's 9,3)")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--intermediate", type=int, default=1536, help="silu_mul width")
    parser.add_argument("--vocab", type=int, default=49152, help="argmax width")
    parser.add_argument("--min-seconds", type=positive, default=0.05,
                        help="time per measurement; the best of --repeats is kept")
    parser.add_argument("--repeats", type=positive_int, default=5,
                        help="measurements per case (best kept)")
    parser.add_argument("--baseline-lib", default=None,
                        help="a .so of the C kernels built from other sources, timed beside")
    parser.add_argument("--out", type=out_file, default=None,
                        help="write the JSON result here (an existing file is replaced)")


def _cases(args, torch):
    """({name: (callable on a lib, output tensor, floats it reads)}, the inputs by name): each
    case's inputs, built once."""
    from graft.errors import GraftConfigError

    try:
        hq, hkv = (int(h) for h in args.heads.split(","))
    except ValueError:
        raise GraftConfigError(f"--heads: {args.heads!r} is not QUERY,KV (e.g. 9,3)") from None
    if min(args.seqs, args.context, hq, hkv, args.head_dim, args.intermediate, args.vocab) < 1 or hq % hkv:
        raise GraftConfigError("row-ops-micro: sizes must be positive and the query heads a multiple of the kv heads")
    gen = torch.Generator().manual_seed(0)
    block = 16
    per_seq = -(-args.context // block)
    q = torch.randn(args.seqs, hq, args.head_dim, generator=gen)
    k = torch.randn(args.seqs * per_seq, block, hkv, args.head_dim, generator=gen)
    v = torch.randn(k.shape, generator=gen)
    tables = torch.arange(args.seqs * per_seq, dtype=torch.int32).reshape(args.seqs, per_seq)
    lens = torch.full((args.seqs,), args.context, dtype=torch.int32)
    att = torch.empty_like(q)
    gate_up = torch.randn(args.seqs, 2 * args.intermediate, generator=gen) * 4
    act = torch.empty(args.seqs, args.intermediate)
    logits = torch.randn(args.seqs, args.vocab, generator=gen)
    picks = torch.empty(args.seqs, dtype=torch.int64)
    inputs = {"q": q, "k": k, "v": v, "tables": tables, "lens": lens, "gate_up": gate_up,
              "logits": logits}
    return {
        "attention": (lambda lib: lib.graft_paged_decode(
            q.data_ptr(), k.data_ptr(), v.data_ptr(), tables.data_ptr(), lens.data_ptr(),
            att.data_ptr(), args.seqs, hq, hkv, args.head_dim, block, per_seq, k.shape[0],
            args.head_dim ** -0.5, None, None, 0, 0, 1), att, q.numel() + 2 * k.numel()),
        "silu_mul": (lambda lib: lib.graft_silu_mul(
            gate_up.data_ptr(), gate_up.stride(0), act.data_ptr(), args.seqs, args.intermediate,
            0, 1), act, gate_up.numel()),
        "argmax": (lambda lib: lib.graft_argmax_rows(
            logits.data_ptr(), logits.stride(0), args.seqs, args.vocab, picks.data_ptr(), 1),
            picks, logits.numel()),
    }, inputs


def run(args) -> int:
    import torch

    from graft.kernels import cpu_ops

    if not cpu_ops.available():
        print("row-ops-micro: the C kernels are not available on this machine (no C compiler)")
        return 1
    lib, baseline = cpu_ops._lib(), _baseline(args.baseline_lib)
    results = []
    print(f"1 thread; {args.seqs} sequences x {args.context} tokens, heads {args.heads} of "
          f"{args.head_dim}; silu_mul {args.seqs} x {args.intermediate}; argmax {args.seqs} x {args.vocab}")
    with torch.inference_mode():
        for name, (call, out, floats) in _cases(args, torch)[0].items():
            seconds = _time(lambda: call(lib), args.min_seconds, args.repeats)
            r = {"op": name, "us": seconds * 1e6, "input_gb_s": floats * 4 / seconds / 1e9}
            line = f"  {name:10s} {r['us']:9.1f} us  {r['input_gb_s']:6.2f} GB/s of inputs"
            if baseline is not None:
                mine = out.clone()
                base_s = _time(lambda: call(baseline), args.min_seconds, args.repeats)
                r.update(baseline_us=base_s * 1e6, speedup_vs_baseline=base_s / seconds,
                         max_abs_diff_vs_baseline=float((out.double() - mine.double()).abs().max()))
                line += (f"  {r['speedup_vs_baseline']:.2f}x baseline ({r['baseline_us']:.1f} us), "
                         f"max |diff| {r['max_abs_diff_vs_baseline']:.1e}")
            results.append(r)
            print(line)
    if args.out:
        from graft.io import atomic_write_json

        atomic_write_json(args.out, {"threads": 1, "seqs": args.seqs, "context": args.context,
                                     "heads": args.heads, "head_dim": args.head_dim,
                                     "intermediate": args.intermediate, "vocab": args.vocab,
                                     "baseline_lib": args.baseline_lib, "results": results})
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":  # the CLI's parser and its one-line config errors
    from graft.cli import main

    sys.exit(main(["bench", "row-ops-micro", *sys.argv[1:]]))
