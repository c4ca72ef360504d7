"""Benchmark the paged-attention kernels against the device's copy bandwidth and torch SDPA,
and the weight-only quantized linears (graft.kernels.triton_quant) against a dense linear.

`python -m graft.benchmarks.kernels --out bench.json` (or `graft bench kernels`) needs a CUDA GPU;
on a CPU-only machine it says so and exits 0.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, dataclass

from graft.benchmarks.cli_args import out_file
from graft.io import atomic_write_json


@dataclass
class BenchConfig:
    batch: int = 64  # decode sequences
    context: int = 4096  # tokens cached per decode sequence
    num_q_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    block_size: int = 16
    dtype: str = "bfloat16"
    prefill_seqs: int = 4  # prompts in the prefill batch
    prefill_len: int = 2048  # tokens per prompt (no cached prefix)
    copy_mib: int = 2048  # size of the device copy that measures achievable bandwidth
    iters: int = 20  # timed repetitions (median reported)
    sweep: bool = False  # also time the launch settings of DECODE_SWEEP / PREFILL_SWEEP
    quant_schemes: str = "bf16,int8,int4-g32,int4-g128"  # weight formats of the linear benchmark ("" skips it)
    quant_rows: str = "1,4,32,512"  # activation rows: decode GEMV to prefill GEMM
    quant_n: int = 4096  # the linear's output features
    quant_k: int = 4096  # its input features


# launch settings tried by --sweep (the defaults are the first entries)
DECODE_SWEEP = [dict(tile_n=t, num_warps=w, partition_size=p) for p in (512, 256, 1024)
                for t in (64, 32, 128) for w in (4, 8)]
PREFILL_SWEEP = [dict(block_m=m, tile_n=t, num_warps=w) for m in (64, 128) for t in (64, 32) for w in (4, 8)]
# quantized linear launch settings tried by --sweep (graft.kernels.triton_quant tuning; the
# defaults come from register counts only): GEMV for <= 4 rows, GEMM above
QUANT_GEMV_SWEEP = [dict(block_n=n, block_k=k, num_warps=w) for n in (32, 64, 128) for k in (32, 64, 128, 256)
                    for w in (4, 8)]
QUANT_GEMM_SWEEP = [dict(block_m=m, block_n=n, block_k=k, num_warps=w) for m in (64, 128) for n in (64, 128)
                    for k in (32, 64) for w in (4, 8)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = BenchConfig()
    for name, value in asdict(defaults).items():
        choices = ["bfloat16", "float16", "float32"] if name == "dtype" else None
        if isinstance(value, bool):
            parser.add_argument(f"--{name}", action="store_true", help="time every launch setting in the sweep")
            continue
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value, choices=choices)
    parser.add_argument("--out", type=out_file, default="",
                        help="write the results as JSON to this file (an existing file is replaced)")


def _time_ms(fn, device, iters: int) -> float:
    """Median wall time of fn in milliseconds (CUDA events on a GPU)."""
    import torch

    fn()  # warm-up (and compilation)
    times = []
    for _ in range(max(iters, 1)):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2]


def _try_time(fn, device, iters: int) -> float | None:
    """_time_ms, or None when this launch setting does not compile or run on the device."""
    try:
        return _time_ms(fn, device, iters)
    except Exception as err:  # e.g. out of shared memory: the sweep goes on
        print(f"  launch setting failed: {type(err).__name__}: {str(err)[:200]}", file=sys.stderr)
        return None


def _paged(cfg: BenchConfig, n_seqs: int, tokens: int, device, dtype):
    """A shuffled paged cache holding n_seqs sequences of `tokens` tokens, with their block tables."""
    import torch

    blocks_per_seq = -(-tokens // cfg.block_size)
    num_blocks = n_seqs * blocks_per_seq
    shape = (num_blocks, cfg.block_size, cfg.num_kv_heads, cfg.head_dim)
    k_cache = torch.randn(shape, device=device, dtype=dtype)
    v_cache = torch.randn(shape, device=device, dtype=dtype)
    perm = torch.randperm(num_blocks, device=device).to(torch.int32)
    block_tables = perm.view(n_seqs, blocks_per_seq)
    return k_cache, v_cache, block_tables


def _gather(cache, block_tables, tokens: int):
    """[n_seqs, Hkv, tokens, D] contiguous copy of each sequence's cache, SDPA's layout."""
    n_seqs = block_tables.shape[0]
    dense = cache[block_tables.long()].flatten(1, 2)[:, :tokens]  # [n_seqs, tokens, Hkv, D]
    return dense.transpose(1, 2).contiguous().view(n_seqs, cache.shape[2], tokens, cache.shape[3])


def bench_decode(cfg: BenchConfig, device, dtype, impl) -> dict:
    import torch
    import torch.nn.functional as F

    k_cache, v_cache, block_tables = _paged(cfg, cfg.batch, cfg.context, device, dtype)
    context_lens = torch.full((cfg.batch,), cfg.context, dtype=torch.int32, device=device)
    q = torch.randn(cfg.batch, cfg.num_q_heads, cfg.head_dim, device=device, dtype=dtype)
    scale = cfg.head_dim ** -0.5
    out = impl.paged_attention_decode(q, k_cache, v_cache, block_tables, context_lens, scale)
    ms = _time_ms(lambda: impl.paged_attention_decode(q, k_cache, v_cache, block_tables, context_lens, scale),
                  device, cfg.iters)
    kv_bytes = 2 * cfg.batch * cfg.context * cfg.num_kv_heads * cfg.head_dim * k_cache.element_size()
    io_bytes = kv_bytes + 2 * q.numel() * q.element_size()
    sweep = []
    for tuning in DECODE_SWEEP if cfg.sweep else []:
        t_ms = _try_time(lambda: impl.paged_attention_decode(q, k_cache, v_cache, block_tables, context_lens,
                                                             scale, **tuning), device, cfg.iters)
        sweep.append(dict(tuning, ms=t_ms, gb_per_s=io_bytes / t_ms / 1e6 if t_ms else 0.0))
    k_dense, v_dense = _gather(k_cache, block_tables, cfg.context), _gather(v_cache, block_tables, cfg.context)
    del k_cache, v_cache
    q4 = q[:, :, None, :]  # [B, Hq, 1, D]
    sdpa = lambda: F.scaled_dot_product_attention(q4, k_dense, v_dense, scale=scale, enable_gqa=True)  # noqa: E731
    diff = (sdpa()[:, :, 0].float() - out.float()).abs().max().item()
    sdpa_ms = _time_ms(sdpa, device, cfg.iters)
    return {"ms": ms, "gb_per_s": io_bytes / ms / 1e6, "sdpa_gathered_ms": sdpa_ms,
            "sdpa_gathered_gb_per_s": io_bytes / sdpa_ms / 1e6, "speedup_vs_sdpa": sdpa_ms / ms,
            "max_abs_diff_vs_sdpa": diff, "bytes": io_bytes, "sweep": sweep}


def bench_prefill(cfg: BenchConfig, device, dtype, impl) -> dict:
    import torch
    import torch.nn.functional as F

    n, length = cfg.prefill_seqs, cfg.prefill_len
    k_cache, v_cache, block_tables = _paged(cfg, n, length, device, dtype)
    context_lens = torch.full((n,), length, dtype=torch.int32, device=device)
    cu = torch.arange(0, (n + 1) * length, length, dtype=torch.int32, device=device)
    q = torch.randn(n * length, cfg.num_q_heads, cfg.head_dim, device=device, dtype=dtype)
    scale = cfg.head_dim ** -0.5
    run = lambda: impl.paged_attention_prefill(q, k_cache, v_cache, block_tables, cu, context_lens, scale)  # noqa: E731
    ms = _time_ms(run, device, cfg.iters)
    flops = 4 * n * cfg.num_q_heads * cfg.head_dim * length * (length + 1) / 2  # causal QK^T + PV
    sweep = []
    for tuning in PREFILL_SWEEP if cfg.sweep else []:
        t_ms = _try_time(lambda: impl.paged_attention_prefill(q, k_cache, v_cache, block_tables, cu, context_lens,
                                                              scale, **tuning), device, cfg.iters)
        sweep.append(dict(tuning, ms=t_ms, tflop_per_s=flops / t_ms / 1e9 if t_ms else 0.0))
    q4 = q.view(n, length, cfg.num_q_heads, cfg.head_dim).transpose(1, 2)  # [n, Hq, L, D]
    k_dense, v_dense = _gather(k_cache, block_tables, length), _gather(v_cache, block_tables, length)
    sdpa = lambda: F.scaled_dot_product_attention(q4, k_dense, v_dense, is_causal=True, scale=scale,  # noqa: E731
                                                  enable_gqa=True)
    diff = (sdpa().transpose(1, 2).reshape(q.shape).float() - run().float()).abs().max().item()
    sdpa_ms = _time_ms(sdpa, device, cfg.iters)
    return {"ms": ms, "tflop_per_s": flops / ms / 1e9, "sdpa_contiguous_ms": sdpa_ms,
            "sdpa_contiguous_tflop_per_s": flops / sdpa_ms / 1e9, "max_abs_diff_vs_sdpa": diff,
            "sweep": sweep}


def bench_copy(cfg: BenchConfig, device) -> dict:
    import torch

    src = torch.empty(cfg.copy_mib * 2**20, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    ms = _time_ms(lambda: dst.copy_(src), device, cfg.iters)
    return {"ms": ms, "gb_per_s": 2 * src.numel() / ms / 1e6}  # read + write


def bench_quant_linear(cfg: BenchConfig, device) -> list[dict]:
    """Per weight format and row count: the Triton quantized linear vs F.linear on the same
    weight in cfg.dtype (dense, cuBLAS on a GPU), bytes moved and the error vs the reference."""
    import torch
    import torch.nn.functional as F

    from graft.kernels import quant_formats as quant, triton_quant

    dtype = getattr(torch, cfg.dtype)
    n, k = cfg.quant_n, cfg.quant_k
    weight = torch.randn(n, k, device=device) * k ** -0.5
    dense = weight.to(dtype)
    results = []
    for name in filter(None, (part.strip() for part in cfg.quant_schemes.split(","))):
        qw = quant.quantize(weight, quant.QuantScheme.parse(name))
        for m in (int(r) for r in cfg.quant_rows.split(",") if r.strip()):
            x = torch.randn(m, k, device=device, dtype=dtype)
            ms = _time_ms(lambda: triton_quant.quant_linear(x, qw), device, cfg.iters)
            dense_ms = _time_ms(lambda: F.linear(x, dense), device, cfg.iters)
            diff = (triton_quant.quant_linear(x, qw).float() - quant.quant_linear(x, qw).float()).abs().max().item()
            io_bytes = qw.nbytes() + m * (k + n) * x.element_size()  # weight, x in, y out
            sweep = []
            for tuning in (QUANT_GEMV_SWEEP if m <= triton_quant.GEMV_MAX_ROWS else QUANT_GEMM_SWEEP) if cfg.sweep else []:
                if qw.scheme.kind == "int4" and qw.scheme.group_size % tuning["block_k"]:
                    continue  # an int4 K tile must lie inside one group
                t_ms = _try_time(lambda: triton_quant.quant_linear(x, qw, **tuning), device, cfg.iters)
                sweep.append(dict(tuning, ms=t_ms, gb_per_s=io_bytes / t_ms / 1e6 if t_ms else 0.0))
            results.append({"scheme": name, "rows": m, "ms": ms, "gb_per_s": io_bytes / ms / 1e6,
                            "tflop_per_s": 2 * m * n * k / ms / 1e9, "dense_ms": dense_ms,
                            "speedup_vs_dense": dense_ms / ms, "max_abs_diff_vs_reference": diff,
                            "sweep": sweep})
    return results


def run_benchmarks(cfg: BenchConfig, device, impl) -> dict:
    import torch

    dtype = getattr(torch, cfg.dtype)
    copy = bench_copy(cfg, device)
    decode = bench_decode(cfg, device, dtype, impl)
    decode["fraction_of_copy_bandwidth"] = decode["gb_per_s"] / copy["gb_per_s"]
    prefill = bench_prefill(cfg, device, dtype, impl)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"device": name, "torch": torch.__version__, "config": asdict(cfg), "copy": copy,
            "decode": decode, "prefill": prefill}


def no_gpu_visible(env=None, exists=None) -> bool:
    """True when no GPU driver is visible: answered from device files, before `import torch`
    (tens of seconds on a busy machine) is spent only to learn that there is no GPU."""
    import os

    env = os.environ if env is None else env
    exists = exists or os.path.exists
    if env.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return True
    # NVIDIA's driver nodes, or ROCm's (torch.cuda also runs on ROCm)
    return not any(exists(p) for p in ("/dev/nvidiactl", "/proc/driver/nvidia", "/dev/kfd"))


def run(args: argparse.Namespace) -> int:
    if no_gpu_visible():
        print("graft.benchmarks.kernels needs a CUDA GPU (no GPU driver found): nothing measured.")
        return 0
    import torch

    if not torch.cuda.is_available():
        print("graft.benchmarks.kernels needs a CUDA GPU (none found): nothing measured.")
        return 0
    from graft.kernels import triton_ops

    fields = asdict(BenchConfig())
    cfg = BenchConfig(**{name: getattr(args, name) for name in fields})
    if cfg.num_q_heads % cfg.num_kv_heads:
        print(f"--num-q-heads {cfg.num_q_heads} must be a multiple of --num-kv-heads {cfg.num_kv_heads}",
              file=sys.stderr)
        return 2
    res = run_benchmarks(cfg, torch.device("cuda"), triton_ops)
    res["quant_linear"] = bench_quant_linear(cfg, torch.device("cuda"))
    d, p, c = res["decode"], res["prefill"], res["copy"]
    print(f"device: {res['device']}   copy bandwidth {c['gb_per_s']:.0f} GB/s")
    print(f"decode  batch {cfg.batch} ctx {cfg.context}: {d['ms']:.3f} ms  {d['gb_per_s']:.0f} GB/s  "
          f"= {d['fraction_of_copy_bandwidth']:.0%} of copy; SDPA on gathered cache {d['sdpa_gathered_ms']:.3f} ms "
          f"(ours x{d['speedup_vs_sdpa']:.2f}); max |diff| {d['max_abs_diff_vs_sdpa']:.2e}")
    print(f"prefill {cfg.prefill_seqs} x {cfg.prefill_len}: {p['ms']:.3f} ms  {p['tflop_per_s']:.1f} TFLOP/s; "
          f"SDPA contiguous {p['sdpa_contiguous_tflop_per_s']:.1f} TFLOP/s; max |diff| {p['max_abs_diff_vs_sdpa']:.2e}")
    for q in res["quant_linear"]:
        q["fraction_of_copy_bandwidth"] = q["gb_per_s"] / c["gb_per_s"]
        print(f"quant linear {q['scheme']:<9} {q['rows']:>4} x {cfg.quant_k} -> {cfg.quant_n}: {q['ms']:.3f} ms  "
              f"{q['gb_per_s']:.0f} GB/s = {q['fraction_of_copy_bandwidth']:.0%} of copy  {q['tflop_per_s']:.1f} TFLOP/s; "
              f"dense {cfg.dtype} x{q['speedup_vs_dense']:.2f}; max |diff| {q['max_abs_diff_vs_reference']:.2e}")
        timed = [r for r in q["sweep"] if r["ms"]]
        if timed:
            best = min(timed, key=lambda r: r["ms"])
            print("    best of sweep: " + ", ".join(f"{k}={v}" for k, v in best.items() if k not in ("ms", "gb_per_s"))
                  + f" -> {best['ms']:.3f} ms {best['gb_per_s']:.0f} GB/s")
    for label, rows, key in (("decode", d["sweep"], "gb_per_s"), ("prefill", p["sweep"], "tflop_per_s")):
        if rows:
            best = max(rows, key=lambda r: r[key])
            print(f"best {label} setting of {len(rows)}: " + ", ".join(f"{k}={v}" for k, v in best.items()
                                                                     if k not in ("ms", key))
                  + f" -> {best[key]:.1f} {key}")
    if args.out:
        atomic_write_json(args.out, res)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(prog="python -m graft.benchmarks.kernels", description=__doc__)
    add_arguments(_parser)
    sys.exit(run(_parser.parse_args()))
