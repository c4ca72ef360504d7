"""graft's engine against llama.cpp on one random-weight MoE checkpoint (docs/benchmarks.md, MoE).

    python -m graft.benchmarks.llamacpp_moe MODEL_DIR LLAMA_CPP_DIR BUILD_BIN --runs 3 --out r.json

LLAMA_CPP_DIR: a llama.cpp source tree (the llama-cpp-python sdist vendors one, with
convert_hf_to_gguf.py and gguf-py); BUILD_BIN: its built llama-bench, llama-batched-bench and
llama-quantize. MODEL_DIR is converted to F32 and Q8_0 GGUF once (next to it), then the tools
alternate, run by run: llama-bench (pp512, tg32 at batch 1), llama-batched-bench (32 parallel
sequences), `graft bench engine --quantization fp32,int8`. Each row's min / median / max over
the runs is printed and written to --out with the raw runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# The converter names a BPE pre-tokenizer by hashing what a known model's tokenizer makes of a
# test string; a tiny test tokenizer matches none. Its values do not change the speed of any
# matmul: call it Qwen2's (the family's own).
_CONVERT = """import sys
sys.path.insert(0, sys.argv.pop(1))
import convert_hf_to_gguf as c
from conversion.base import TextModel
TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
sys.exit(c.main())
"""


def convert(model_dir: Path, src: Path, bin_dir: Path) -> dict[str, Path]:
    out = {"f32": model_dir / "bench-f32.gguf", "q8_0": model_dir / "bench-q8_0.gguf"}
    if not out["f32"].exists():
        with tempfile.NamedTemporaryFile("w", suffix=".py") as script:
            script.write(_CONVERT)
            script.flush()
            env = dict(os.environ, PYTHONPATH=str(src / "gguf-py"))
            subprocess.run([sys.executable, script.name, str(src), str(model_dir), "--outtype",
                            "f32", "--outfile", str(out["f32"])], check=True, env=env)
    if not out["q8_0"].exists():
        subprocess.run([str(bin_dir / "llama-quantize"), str(out["f32"]), str(out["q8_0"]),
                        "Q8_0"], check=True)
    return out


def llama_bench(bin_dir: Path, gguf: Path, threads: int) -> dict[str, float]:
    res = subprocess.run([str(bin_dir / "llama-bench"), "-m", str(gguf), "-t", str(threads),
                          "-p", "512", "-n", "32", "-r", "1", "-o", "json"],
                         check=True, capture_output=True, text=True)
    rows = json.loads(res.stdout)
    return {("prefill512" if r["n_prompt"] else "b1_decode"): r["avg_ts"] for r in rows}


def batched_bench(bin_dir: Path, gguf: Path, threads: int) -> float:
    """Decode tok/s of 32 sequences (64-token prompts, 32 new tokens each)."""
    res = subprocess.run([str(bin_dir / "llama-batched-bench"), "-m", str(gguf), "-t",
                          str(threads), "-c", "4096", "-b", "2048", "-npp", "64", "-ntg", "32",
                          "-npl", "32", "--output-format", "jsonl"],
                         check=True, capture_output=True, text=True)
    row = json.loads([line for line in res.stdout.splitlines() if line.startswith("{")][-1])
    return row["speed_tg"]


def graft_bench(model_dir: Path, threads: int) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        subprocess.run([sys.executable, "-m", "graft.cli", "bench", "engine", str(model_dir),
                        "--quantization", "fp32,int8", "--decode-tokens", "32",
                        "--bandwidth-mb", "256", "--threads", str(threads), "--out", str(out)],
                       check=True, env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
        formats = json.loads(out.read_text())["formats"]
    return {name: {"b1_decode": f["batch1_decode_tokens_per_s"],
                   "b32_decode": f["batch32_decode_tokens_per_s"],
                   "prefill512": f["prefill512_tokens_per_s"]} for name, f in formats.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir", type=Path)
    p.add_argument("llama_cpp_dir", type=Path)
    p.add_argument("bin_dir", type=Path)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    ggufs = convert(args.model_dir, args.llama_cpp_dir, args.bin_dir)
    runs: dict[str, list[float]] = {}
    for _ in range(args.runs):
        for fmt, gguf in ggufs.items():
            row = llama_bench(args.bin_dir, gguf, args.threads)
            row["b32_decode"] = batched_bench(args.bin_dir, gguf, args.threads)
            for key, value in row.items():
                runs.setdefault(f"llama.cpp {fmt} {key}", []).append(value)
        for fmt, row in graft_bench(args.model_dir, args.threads).items():
            for key, value in row.items():
                runs.setdefault(f"graft {fmt} {key}", []).append(value)
    summary = {name: [min(v), statistics.median(v), max(v)] for name, v in sorted(runs.items())}
    for name, (lo, mid, hi) in summary.items():
        print(f"{name:32s} {lo:8.1f} / {mid:8.1f} / {hi:8.1f} tok/s")
    if args.out:
        args.out.write_text(json.dumps({"threads": args.threads, "runs": runs,
                                        "min_median_max": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
