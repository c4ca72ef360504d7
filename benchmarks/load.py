"""`graft bench load MODEL [MODEL ...]`: how long graft's engine takes to start on each model
(an LLM dir, a run dir or a llama.cpp GGUF file) and how much memory it takes doing so.

Each load runs in a fresh process (a peak RSS is a whole process's), the models taking turns
for --runs rounds so that drift hits each alike: the seconds Engine.from_pretrained takes,
the process's peak RSS, what stays resident once loaded, and the bytes of the model's own
tensors. min/median/max over the runs, and each model's median against the first model's.
A GGUF's LLM dir is made before the rounds (on a file's first use; its seconds reported apart).
The KV pool is fixed at --kv-blocks so that it is not what is measured. Writes JSON.

Why: the engine reads a GGUF's Q4_0/Q4_1 linears straight from their blocks
(graft.gguf_file); this measures that against, say, the same model's safetensors dir
quantized at load (`--quantization ,int4-g32`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from graft.benchmarks.cli_args import out_file, positive_int
from graft.errors import GraftConfigError, GraftError

_CHILD = """
import json, resource, sys, time
from graft.serving import Engine, EngineConfig
path, quantization, dtype, blocks = sys.argv[1:5]
options = dict(quantization=quantization) if quantization else {}
start = time.perf_counter()
engine = Engine.from_pretrained(path, EngineConfig(dtype=dtype, num_kv_blocks=int(blocks), **options))
seconds = time.perf_counter() - start
with open("/proc/self/statm") as f:
    resident = int(f.read().split()[1]) * resource.getpagesize()
model = engine.runner.model
print(json.dumps({"load_s": seconds, "resident_bytes": resident,
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "tensor_bytes": sum(t.numel() * t.element_size() for t in model.resident_tensors()),
                  "plan": sorted({s.name for s in engine.runner.quant_plan.values()})}))
"""
METRICS = ("load_s", "peak_rss_bytes", "resident_bytes", "tensor_bytes")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("models", nargs="+",
                        help="LLM dirs, run dirs or .gguf files; the first is the baseline of the ratios")
    parser.add_argument("--quantization", default=None,
                        help="one weight scheme per model, comma-separated, empty for the model's "
                             "default (e.g. ',int4-g32': the first as it is, the second in int4-g32)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--runs", type=positive_int, default=3, help="loads of each model")
    parser.add_argument("--kv-blocks", type=positive_int, default=64,
                        help="the KV pool's blocks (fixed, small: not what is measured)")
    parser.add_argument("--timeout", type=positive_int, default=1800, help="seconds per load")
    parser.add_argument("--out", type=out_file, default=None,
                        help="write the JSON result here (an existing file is replaced)")


def _schemes(args) -> list[str]:
    if args.quantization is None:
        return [""] * len(args.models)
    schemes = [s.strip() for s in args.quantization.split(",")]
    if len(schemes) != len(args.models):
        raise GraftConfigError(f"--quantization names {len(schemes)} schemes for {len(args.models)} "
                         "models: give one per model, comma-separated (empty for the default)")
    return schemes


def _load_once(path: str, scheme: str, args) -> dict:
    argv = [sys.executable, "-c", _CHILD, path, scheme, args.dtype, str(args.kv_blocks)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        raise GraftError(f"{path}: the engine did not load within --timeout {args.timeout} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise GraftError(f"{path}: the engine failed to load: {last}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(args) -> int:
    from graft.benchmarks.report import emit, spread
    from graft.gguf_llm import is_gguf_file, model_path

    schemes = _schemes(args)
    names = [f"{m}" + (f" ({s})" if s else "") for m, s in zip(args.models, schemes)]
    if len(set(names)) != len(names):
        raise GraftConfigError("the same model and scheme twice: give each once")
    paths, made = [], {}
    for model in args.models:
        start = time.perf_counter()
        paths.append(str(model_path(model)))  # a GGUF's LLM dir, made here when missing
        if is_gguf_file(model):
            made[model] = time.perf_counter() - start
    runs = {name: [] for name in names}
    for _ in range(args.runs):
        for name, path, scheme in zip(names, paths, schemes):
            runs[name].append(_load_once(path, scheme, args))
    result = {"dtype": args.dtype, "runs": args.runs, "kv_blocks": args.kv_blocks,
              "gguf_dir_ready_s": made, "models": {}}
    for name, rs in runs.items():
        result["models"][name] = {"plan": rs[0]["plan"], "runs": rs,
                                  **{m: spread([r[m] for r in rs]) for m in METRICS}}
    base = result["models"][names[0]]
    for entry in result["models"].values():
        entry["vs_first"] = {m: entry[m]["median"] / base[m]["median"] for m in ("load_s", "peak_rss_bytes")}
    _print(result)
    if args.out:
        emit(result, args.out)
        print(f"wrote {args.out}")
    return 0


def _print(result: dict) -> None:
    gb = 1e9
    print(f"engine start, {result['runs']} runs each (min / median / max), dtype {result['dtype']}")
    for name, e in result["models"].items():
        s, peak = e["load_s"], e["peak_rss_bytes"]
        print(f"  {name}: {s['min']:.1f} / {s['median']:.1f} / {s['max']:.1f} s, peak RSS "
              f"{peak['min'] / gb:.2f} / {peak['median'] / gb:.2f} / {peak['max'] / gb:.2f} GB, "
              f"resident {e['resident_bytes']['median'] / gb:.2f} GB "
              f"(tensors {e['tensor_bytes']['median'] / gb:.2f}); vs the first: "
              f"{e['vs_first']['load_s']:.2f}x time, {e['vs_first']['peak_rss_bytes']:.2f}x peak")
    for model, seconds in result["gguf_dir_ready_s"].items():
        print(f"  ({model}: its LLM dir ready in {seconds:.1f} s; made on the first use of a file)")
