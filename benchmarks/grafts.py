"""`graft bench grafts`: N grafts in one engine vs N separate engines (one process each) on the
same machine, same requests, same mix: bytes resident, tokens/s, TTFT p50/p99, and ratios.

Each setup runs in fresh subprocesses (grafts_worker.py), so RSS is measured per
process; the N separate engines load first, then all start the workload together.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from graft.benchmarks.cli_args import out_file
from graft.serving.engine.engine_args import add_engine_args, engine_values

SMOLLM2 = "~/.cache/graft/smollm2-135m-instruct"  # written by `graft models prepare`
_PROMPTS = ["Describe the picture in one sentence.", "What is in the image?",
            "Which colors do you see?", "Is there a person in the picture?"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--graft", action="append", default=[], metavar="NAME=RUN_DIR",
                   help="a real run dir (repeat); without it, --synthetic grafts are built")
    p.add_argument("--synthetic", type=int, default=3,
                   help="number of random grafts (random timm ViT + MLP projector, own seeds) "
                        "over --llm when no --graft is given")
    p.add_argument("--shared-encoder", action="store_true",
                   help="synthetic grafts share one encoder (different projectors)")
    p.add_argument("--llm", default=None, help=f"LLM dir for synthetic grafts (default {SMOLLM2})")
    p.add_argument("--num-requests", type=int, default=24, help="total, split over the grafts")
    p.add_argument("--image-ratio", type=float, default=0.5, help="share of requests with an image")
    p.add_argument("--max-tokens", type=int, default=16, help="output tokens per request")
    p.add_argument("--rate", type=float, default=None,
                   help="Poisson arrivals per second (default: every request at t=0)")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--shared-kv-blocks", type=int, default=None,
                   help="KV pool of the one shared engine (default --num-kv-blocks; pass N times "
                        "it to compare at the same total KV memory)")
    p.add_argument("--cores", type=int, default=None,
                   help="pin every process to the first CORES cores this process may use; the "
                        "shared engine runs CORES torch threads, each separate one CORES/N "
                        "(at least 1), so both setups get the same CPU (default: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work-dir", default=None, help="where synthetic run dirs go (default: temp)")
    p.add_argument("--out", type=out_file, default=None,
                   help="write the JSON result here (an existing file is replaced)")
    # every engine of both setups (--num-kv-blocks: the KV pool of each)
    add_engine_args(p, exclude=("seed",), defaults={"num_kv_blocks": 256, "max_num_seqs": 32,
                                                    "max_num_batched_tokens": 1024})


def workload(names: list[str], n: int, image_ratio: float, rate: float | None,
             seed: int) -> list[dict]:
    """Seeded requests, graft chosen round-robin so every graft gets the same share."""
    rng = random.Random(seed)
    at, reqs = 0.0, []
    for k in range(n):
        if rate:
            at += rng.expovariate(rate)
        image = rng.random() < image_ratio
        reqs.append({"id": f"r{k}", "graft": names[k % len(names)], "at": at,
                     "prompt": f"{_PROMPTS[k % len(_PROMPTS)]} (request {k})",
                     "image_seed": k if image else None})
    return reqs


def make_synthetic_grafts(llm: Path, n: int, root: Path, shared_encoder: bool,
                          image_size: int) -> dict[str, str]:
    """N run dirs as `graft train` writes them (graft.yaml with llm.sha256, adapter files),
    with random encoders and projectors: serving cost does not depend on trained values."""
    from transformers import AutoConfig

    from graft.adapters import AdapterConfig, build_adapter, save_adapter
    from graft.encoders import EncoderConfig, build_encoder
    from graft.io import weights_sha256
    from graft.run_dir import RunDir
    from graft.spec import GraftSpec

    d_model, sha = AutoConfig.from_pretrained(str(llm)).hidden_size, weights_sha256(llm)
    runs = {}
    for i in range(n):
        enc = EncoderConfig(kind="timm", model_name="vit_tiny_patch16_224", image_size=image_size,
                            seed=0 if shared_encoder else i)
        d_vision = build_encoder(enc).hidden_size
        proj = build_adapter(AdapterConfig(kind="mlp", depth=2, seed=i), d_vision, d_model)
        run = root / f"graft{i}"
        save_adapter(proj, run)
        GraftSpec.from_dict({"encoder": enc.to_dict(), "adapter": proj.config.to_dict(),
                             "llm": {"path": str(llm), "sha256": sha}}).save(RunDir(run).spec_file)
        runs[f"graft{i}"] = str(run)
    return runs


def _spawn(job: dict) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "graft.benchmarks.grafts_worker"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    proc.stdin.write(json.dumps(job) + "\n")
    proc.stdin.flush()
    return proc


def _read(proc: subprocess.Popen) -> dict:
    line = proc.stdout.readline()
    if not line:
        proc.wait()
        raise RuntimeError(f"bench worker exited with code {proc.returncode} (see its stderr)")
    return json.loads(line)


def run_setup(jobs: list[dict]) -> list[dict]:
    """Start every worker, wait until all are loaded, then start them together."""
    procs = [_spawn(job) for job in jobs]
    try:
        ready = [_read(p) for p in procs]
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        results = [_read(p) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.stdin.close()
                p.wait(timeout=60)
    return [{**r, "loaded": ready_one} for r, ready_one in zip(results, ready)]


def _pct(values: list[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(values, q)) if values else float("nan")


def summarize(results: list[dict]) -> dict:
    ttft = [t for r in results for t in r["ttft_s"].values()]
    tokens = sum(r["output_tokens"] for r in results)
    wall = max(r["wall_s"] for r in results)  # the setups started together
    return {"processes": len(results), "requests": sum(r["requests"] for r in results),
            "output_tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall,
            "ttft_p50_s": _pct(ttft, 50), "ttft_p99_s": _pct(ttft, 99),
            "bytes_resident": sum(r["loaded"]["bytes"]["total"] for r in results),
            "bytes": {k: sum(r["loaded"]["bytes"][k] for r in results)
                      for k in results[0]["loaded"]["bytes"]},
            "rss_loaded": sum(r["loaded"]["rss"] for r in results),
            "rss_peak": sum(r["rss_after"]["rss_peak"] for r in results),
            "prefix_cache_hit_rate": [r["prefix_cache_hit_rate"] for r in results]}


def _work_dir(path: str | None) -> str | None:
    """--work-dir, made if missing (its parents too); a one-line error where it cannot be."""
    from graft.errors import GraftConfigError

    if path is None:
        return None
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise GraftConfigError(f"--work-dir {path}: cannot be used as a folder ({e.strerror}); "
                               "pass a folder, or leave it out for a temporary one") from None
    return path


def run(args) -> int:
    from graft.errors import GraftConfigError
    from graft.serving.multimodal.grafts import parse_graft_arg
    from graft.spec import GraftSpec

    if args.num_requests <= 0 or not 0.0 <= args.image_ratio <= 1.0:
        raise GraftConfigError("--num-requests must be > 0 and --image-ratio in [0, 1]")
    allowed = sorted(os.sched_getaffinity(0))
    if args.cores is not None and not 1 <= args.cores <= len(allowed):
        raise GraftConfigError(f"--cores {args.cores}: this process may use {len(allowed)} cores")
    cpus = allowed[:args.cores or len(allowed)]
    threads = len(cpus)
    tmp = None
    if args.graft:
        grafts = dict(parse_graft_arg(g) for g in args.graft)
        llm = args.llm
    else:
        llm = Path(GraftSpec.expand(args.llm or SMOLLM2))
        if not (llm / "config.json").is_file():
            raise GraftConfigError(f"--llm {llm}: no config.json; pass an HF LLM dir or run "
                                   "`graft models prepare` for the default SmolLM2")
        if args.synthetic < 1:
            raise GraftConfigError("--synthetic must be >= 1 (or pass --graft NAME=RUN_DIR)")
        tmp = tempfile.TemporaryDirectory(dir=_work_dir(args.work_dir))
        grafts = make_synthetic_grafts(llm, args.synthetic, Path(tmp.name), args.shared_encoder,
                                       args.image_size)
    names = list(grafts)
    reqs = workload(names, args.num_requests, args.image_ratio, args.rate, args.seed)
    engine = engine_values(args)  # to each worker as JSON: EngineConfig(**engine) there
    base = {"llm": str(llm) if llm else None, "engine": engine, "image_size": args.image_size,
            "max_tokens": args.max_tokens, "cpus": cpus}
    try:
        shared_engine = {**engine, "num_kv_blocks": args.shared_kv_blocks or args.num_kv_blocks}
        one = run_setup([{**base, "engine": shared_engine, "grafts": grafts, "requests": reqs,
                          "threads": threads}])
        per = max(1, threads // len(names))
        separate = run_setup([{**base, "grafts": {n: grafts[n]}, "threads": per,
                               "requests": [r for r in reqs if r["graft"] == n]} for n in names])
    finally:
        if tmp is not None:
            tmp.cleanup()
    result = {"grafts": names, "synthetic": not args.graft, "llm": base["llm"],
              "num_requests": args.num_requests, "image_ratio": args.image_ratio,
              "max_tokens": args.max_tokens, "rate": args.rate, "seed": args.seed,
              "engine": engine, "shared_kv_blocks": shared_engine["num_kv_blocks"],
              "cpus": cpus, "threads": {"shared": threads, "separate_each": per},
              "shared": summarize(one), "separate": summarize(separate)}
    s, p = result["shared"], result["separate"]
    result["ratios"] = {  # shared / separate: < 1 is better for bytes and TTFT
        "bytes_resident": s["bytes_resident"] / p["bytes_resident"],
        "rss_loaded": s["rss_loaded"] / p["rss_loaded"],
        "tokens_per_s": s["tokens_per_s"] / p["tokens_per_s"],
        "ttft_p50": s["ttft_p50_s"] / p["ttft_p50_s"], "ttft_p99": s["ttft_p99_s"] / p["ttft_p99_s"]}
    _print(result)
    if args.out:
        from graft.io import atomic_write_json

        atomic_write_json(Path(args.out), result)
    return 0


def _print(r: dict) -> None:
    mb = 1 / (1 << 20)
    print(f"{len(r['grafts'])} grafts, {r['num_requests']} requests "
          f"({r['image_ratio']:.0%} with an image), {r['max_tokens']} tokens each")
    for key, label in (("shared", "one engine"), ("separate", f"{len(r['grafts'])} engines")):
        s = r[key]
        print(f"{label:>10}: params+KV {s['bytes_resident'] * mb:8.1f} MiB, RSS "
              f"{s['rss_loaded'] * mb:8.1f} MiB, {s['tokens_per_s']:7.1f} tok/s, TTFT p50 "
              f"{s['ttft_p50_s'] * 1e3:7.1f} ms p99 {s['ttft_p99_s'] * 1e3:7.1f} ms")
    q = r["ratios"]
    print(f"one/separate: bytes {q['bytes_resident']:.2f}x, RSS {q['rss_loaded']:.2f}x, "
          f"tok/s {q['tokens_per_s']:.2f}x, TTFT p50 {q['ttft_p50']:.2f}x p99 {q['ttft_p99']:.2f}x")
