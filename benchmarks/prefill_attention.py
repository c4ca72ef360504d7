"""`graft bench prefill-attention` (or `python -m graft.benchmarks.prefill_attention`): the
engine's CPU prefill attention alone, graft's C kernel (kernels/csrc/paged_prefill_cpu.c)
against the reference path it replaced (gather the blocks, torch's fused SDPA), on the same
paged inputs in one process, calls alternating, the fastest of --repeats kept. Prints GFLOP/s
of the causal products (QK^T and PV, 4 * D flops per visible query-key pair), the ratio and
the largest difference of the two outputs; writes JSON.

The default case is a prefill step of SmolLM2-135M's serving shape: 4 prompts of 512 tokens,
9 query / 3 KV heads of 64. --cached N puts N tokens of each prompt in the cache already (a
chunk after a prefix hit, or a chunked prefill's later chunk).
"""

from __future__ import annotations

import argparse
import sys
import time

from graft.benchmarks.cli_args import out_file
from graft.cli_types import number_in
from graft.errors import GraftConfigError

_count = number_in(int, low=1)
_DTYPES = ("float32", "bfloat16")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seqs", type=_count, default=4, help="prompts in the step")
    parser.add_argument("--prompt-len", type=_count, default=512, help="query tokens per prompt")
    parser.add_argument("--cached", type=number_in(int, low=0), default=0,
                        help="tokens of each prompt already in the cache before these queries")
    parser.add_argument("--heads", default="9,3", help="query,kv heads (default: SmolLM2's 9,3)")
    parser.add_argument("--head-dim", type=_count, default=64)
    parser.add_argument("--block-size", type=_count, default=16)
    parser.add_argument("--dtype", choices=_DTYPES, default="float32", help="queries and cache")
    parser.add_argument("--threads", type=_count, default=2, help="torch / OpenMP threads")
    parser.add_argument("--repeats", type=_count, default=10,
                        help="timed calls of each (the fastest kept)")
    parser.add_argument("--out", type=out_file, default=None,
                        help="write the JSON result here (an existing file is replaced)")


def _heads(text: str) -> tuple[int, int]:
    hq, sep, hkv = text.partition(",")
    if not (sep and hq.strip().isdigit() and hkv.strip().isdigit() and int(hkv) > 0
            and int(hq) % int(hkv) == 0):
        raise GraftConfigError(f"--heads: {text!r} is not QUERY,KV with QUERY a multiple of KV "
                               "(e.g. 9,3)")
    return int(hq), int(hkv)


def paged_inputs(args, torch):
    """(q, k_cache, v_cache, block_tables, cu_seqlens, context_lens, scale): random rows in a
    cache whose blocks are shuffled, as a long-running engine's are."""
    hq, hkv = _heads(args.heads)
    dtype = getattr(torch, args.dtype)
    n = args.cached + args.prompt_len
    per_seq = -(-n // args.block_size)
    gen = torch.Generator().manual_seed(0)
    num_blocks = args.seqs * per_seq
    shape = (num_blocks, args.block_size, hkv, args.head_dim)
    k_cache, v_cache = (torch.randn(shape, generator=gen).to(dtype) for _ in range(2))
    tables = torch.randperm(num_blocks, generator=gen).to(torch.int32).view(args.seqs, per_seq)
    q = torch.randn(args.seqs * args.prompt_len, hq, args.head_dim, generator=gen).to(dtype)
    cu = torch.arange(0, (args.seqs + 1) * args.prompt_len, args.prompt_len, dtype=torch.int32)
    lens = torch.full((args.seqs,), n, dtype=torch.int32)
    return q, k_cache, v_cache, tables, cu, lens, args.head_dim ** -0.5


def _fastest(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def run(args) -> int:
    import torch

    from graft.kernels import cpu_ops, reference

    inputs = paged_inputs(args, torch)
    if not (cpu_ops.available() and cpu_ops.supports_prefill(inputs[0], inputs[1])):
        why = cpu_ops.unavailable_reason() or "a build without it, or a head size it does not take"
        print(f"prefill-attention: graft's C prefill kernel is not available here ({why})")
        return 1
    torch.set_num_threads(args.threads)
    hq, _ = _heads(args.heads)
    c_call = lambda: cpu_ops.paged_attention_prefill(*inputs)  # noqa: E731
    ref_call = lambda: reference.paged_attention_prefill(*inputs)  # noqa: E731
    with torch.inference_mode():
        got, want = c_call(), ref_call()  # also the warm-up
        c_s, ref_s = float("inf"), float("inf")
        for _ in range(args.repeats):  # alternating, so a slow spell of the machine hits both
            c_s = min(c_s, _fastest(c_call, 1))
            ref_s = min(ref_s, _fastest(ref_call, 1))
    m, n = args.prompt_len, args.cached + args.prompt_len
    pairs = args.seqs * m * (2 * n - m + 1) / 2  # query i sees n - m + i + 1 keys
    flops = 4 * hq * args.head_dim * pairs
    result = {"seqs": args.seqs, "prompt_len": m, "cached": args.cached, "heads": args.heads,
              "head_dim": args.head_dim, "block_size": args.block_size, "dtype": args.dtype,
              "threads": args.threads, "repeats": args.repeats,
              "c_ms": c_s * 1e3, "c_gflop_s": flops / c_s / 1e9,
              "reference_ms": ref_s * 1e3, "reference_gflop_s": flops / ref_s / 1e9,
              "speedup_vs_reference": ref_s / c_s,
              "max_abs_diff_vs_reference": float((got.double() - want.double()).abs().max())}
    print(f"{args.seqs} x {m} queries after {args.cached} cached, heads {args.heads} of "
          f"{args.head_dim}, {args.dtype}, {args.threads} threads, fastest of {args.repeats}")
    print(f"  C kernel   {result['c_ms']:8.2f} ms  {result['c_gflop_s']:6.1f} GFLOP/s")
    print(f"  reference  {result['reference_ms']:8.2f} ms  "
          f"{result['reference_gflop_s']:6.1f} GFLOP/s (gather + torch SDPA)")
    print(f"  C / reference: {result['speedup_vs_reference']:.2f}x, max |diff| "
          f"{result['max_abs_diff_vs_reference']:.1e}")
    if args.out:
        from graft.io import atomic_write_json

        atomic_write_json(args.out, result)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":  # the CLI's parser and its one-line config errors
    from graft.cli import main

    sys.exit(main(["bench", "prefill-attention", *sys.argv[1:]]))
