"""`graft bench linears [MODEL_DIR]`: every CPU linear path on the model's weight shapes, in
one process: fp32 F.linear (MKL) and oneDNN-prepacked fp32 (the engine's fp32 path), torch's
weight-only `_weight_int8pack_mm` and `_weight_int4pack_mm_for_cpu`, torch.ao's dynamic int8
Linear (quantizes activations too: other numbers), and graft's C kernels in fp32/bf16/int8/
int4. Per path and row count: microseconds for one pass over a layer's four linears plus the
head, the ratio to fp32 F.linear, and the largest difference from the dequantized reference.
Cache-hot (the same weights every repeat): this ranks kernels; `graft bench engine
--quantization` measures decode from memory. Writes JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from graft.benchmarks.cli_args import int_list, out_file, positive_int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_dir", nargs="?", default=None,
                        help="HF LLM dir whose shapes to use (default: SmolLM2-135M's)")
    parser.add_argument("--rows", type=int_list, default="1,4,32,512",
                        help="comma-separated row counts")
    parser.add_argument("--repeats", type=positive_int, default=20,
                        help="timed passes per case (best kept)")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    parser.add_argument("--out", type=out_file, default=None,
                        help="write the JSON result here (an existing file is replaced)")


SMOLLM2 = {"hidden": 576, "intermediate": 1536, "q": 576, "kv": 192, "vocab": 49152}


def model_shapes(model_dir) -> list[tuple[int, int]]:
    """(out, in) of one layer's qkv, o, gate|up, down and the head."""
    d = dict(SMOLLM2)
    if model_dir is not None:
        from graft.errors import GraftConfigError

        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise GraftConfigError(f"MODEL_DIR {model_dir}: no config.json; give an HF LLM dir, "
                                   "or leave it out for SmolLM2-135M's shapes")
        try:
            cfg = json.loads(path.read_text())
            head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
            d = {"hidden": cfg["hidden_size"], "intermediate": cfg["intermediate_size"],
                 "q": cfg["num_attention_heads"] * head_dim, "vocab": cfg["vocab_size"],
                 "kv": cfg.get("num_key_value_heads", cfg["num_attention_heads"]) * head_dim}
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise GraftConfigError(f"{path}: not a decoder LLM config ({type(err).__name__}: "
                                   f"{err}); give an HF LLM dir") from None
    h = d["hidden"]
    return [(d["q"] + 2 * d["kv"], h), (h, d["q"]), (2 * d["intermediate"], h),
            (h, d["intermediate"]), (d["vocab"], h)]


def _paths(weights):
    """name -> (prepared weights, fn(x, prepared) -> y, scheme whose dequantized value it uses)."""
    import torch
    import torch.nn.functional as F

    from graft.kernels import cpu_linear, cpu_ops, cpu_quant
    from graft.kernels.quant_formats import QuantScheme, quantize

    paths = {"fp32 F.linear": ([w for w in weights], F.linear, "fp32")}
    if cpu_linear.unavailable_reason(torch.float32) is None:
        paths["fp32 oneDNN"] = ([cpu_linear.pack_weight(w) for w in weights], cpu_linear.packed_linear, "fp32")
    q8 = [quantize(w, QuantScheme.parse("int8")) for w in weights]
    paths["torch _weight_int8pack_mm"] = (
        [(q.qweight, q.scales) for q in q8], lambda x, p: torch.ops.aten._weight_int8pack_mm(x, *p), "int8")
    try:
        q4 = [_torch_int4(w) for w in weights]
        paths["torch _weight_int4pack_mm_for_cpu"] = (
            q4, lambda x, p: torch.ops.aten._weight_int4pack_mm_for_cpu(x, p[0], 32, p[1]), None)
    except (RuntimeError, AttributeError) as err:  # not in every torch build
        print(f"skipping torch int4: {err}")
    paths["torch.ao dynamic int8 (activations too)"] = (
        [_ao_dynamic(w) for w in weights], lambda x, m: m(x), None)
    if cpu_ops.available():
        own = cpu_quant.isa()
        # this CPU's path, the VNNI one a CPU without AMX would run, and the AVX2 one a CPU
        # without AVX-512 would run
        levels = ([own] + (["avx512-vnni"] if own == "avx512-amx" else [])
                  + (["avx2"] if own.startswith("avx512") else []))
        for name in ("fp32", "bf16", "int8", "int4-g32", "int4-g64"):
            scheme = QuantScheme.parse(name)
            if all(w.shape[1] % max(scheme.group_size, 1) == 0 for w in weights):
                qs = [quantize(w, scheme) for w in weights]
                for level in levels:
                    paths[f"graft C {name} ({level})"] = (qs, _capped(cpu_quant, level), name)
    return paths


def _capped(cpu_quant, level):
    def run(x, weight):
        with cpu_quant.isa_capped(level):
            return cpu_quant.quant_linear(x, weight)
    return run


def _torch_int4(w):
    import torch

    qw = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
        torch.randint(0, 16, w.shape, dtype=torch.int32), 1)
    scales_zeros = torch.ones(w.shape[1] // 32, w.shape[0], 2)
    return qw, scales_zeros


def _ao_dynamic(w):
    import torch

    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
    lin.weight.data.copy_(w)
    torch.backends.quantized.engine = "x86" if "x86" in torch.backends.quantized.supported_engines else \
        torch.backends.quantized.engine
    return torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(lin), {torch.nn.Linear}, dtype=torch.qint8)


def run(args) -> int:
    import torch

    from graft.kernels.quant_formats import QuantScheme, quant_linear, quantize

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    rows = args.rows
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(o, i, generator=g) * 0.05 for o, i in model_shapes(args.model_dir)]
    paths = _paths(weights)
    result = {"shapes": [list(w.shape) for w in weights], "threads": torch.get_num_threads(),
              "repeats": args.repeats, "rows": {}}
    with torch.inference_mode():
        for m in rows:
            xs = [torch.randn(m, w.shape[1], generator=g) for w in weights]
            refs = {}
            per = {}
            for name, (prepared, fn, scheme) in paths.items():
                best = float("inf")
                for _ in range(args.repeats + 1):  # the first pass warms up
                    t0 = time.perf_counter()
                    outs = [fn(x, p) for x, p in zip(xs, prepared)]
                    best = min(best, time.perf_counter() - t0)
                err = None
                if scheme is not None:
                    if scheme not in refs:
                        deq = [quantize(w, QuantScheme.parse(scheme)) for w in weights]
                        refs[scheme] = [quant_linear(x, d) for x, d in zip(xs, deq)]
                    err = max(float((o - r).abs().max() / r.abs().max()) for o, r in zip(outs, refs[scheme]))
                per[name] = {"us": best * 1e6, "max_rel_diff": err}
            base = per["fp32 F.linear"]["us"]
            for v in per.values():
                v["speedup_vs_fp32_f_linear"] = base / v["us"]
            result["rows"][str(m)] = per
            print(f"rows={m}")
            for name, v in per.items():
                diff = "" if v["max_rel_diff"] is None else f"  max rel diff {v['max_rel_diff']:.1e}"
                print(f"  {name:42s} {v['us']:9.1f} us  {v['speedup_vs_fp32_f_linear']:5.2f}x{diff}")
    if args.out:
        from graft.io import atomic_write_bytes

        atomic_write_bytes(Path(args.out), json.dumps(result, indent=2).encode())
    return 0
