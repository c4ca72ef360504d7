"""The serve-under-load row of `graft bench peers`: a server started as a subprocess (`graft
serve`, or a peer's OpenAI server), then `graft bench serve`'s load generator against it, the
same seeded text workload for every server."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import subprocess
import time
from pathlib import Path

from graft.benchmarks import peers_vllm
from graft.benchmarks.peers_llamacpp import PeerUnavailable, failure_line
from graft.benchmarks.peers_report import FORMATS, GRAFT_DTYPE
from graft.subprocess_argv import graft_argv

START_TIMEOUT_S = 600  # vLLM on a loaded 2-core machine starts in about a minute


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def graft_serve_command(model_dir: Path, scheme: str, port: int, max_model_len: int,
                        dtype: str = "float32") -> list[str]:
    return graft_argv("serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port),
                      "--served-model-name", "graft", "--quantization", scheme, "--dtype", dtype,
                      "--max-model-len", str(max_model_len))


def serve_servers(model_dir: Path, fmt: str, max_len: int, threads: int,
                  vllm: peers_vllm.Vllm | None, scheme: str | None = None) -> list[tuple]:
    """(name, port -> command line, environment) of graft's server (in `scheme`, default the
    one FORMATS matches to `fmt`) and vLLM's (where given) serving `fmt`, each with `threads`
    threads."""
    servers = [("graft", lambda port: graft_serve_command(
        model_dir, scheme or FORMATS[fmt], port, max_len, GRAFT_DTYPE.get(fmt, "float32")),
                dict(os.environ, OMP_NUM_THREADS=str(threads)))]
    if vllm is not None:
        servers.append(("vllm", lambda port: vllm.serve_command(model_dir, fmt, port, max_len),
                        vllm.env(threads)))
    return servers


def in_turn(items: list, i: int) -> list:
    """items from run i's place on: the order rotates run by run, so no tool always goes
    first on a drifting machine."""
    k = i % len(items)
    return items[k:] + items[:k]


def measure_each(servers: list[tuple], i: int, runs: int, logs: Path, tag: str,
                 measure) -> tuple[dict, dict]:
    """Run i of a bench over servers ((name, port -> command line, environment)): each
    started in turn, `measure(url)` while it serves, then stopped (its log: logs/NAME-TAG-i.log).
    Returns ({name: what measure returned}, {name: why a peer did not start}); graft not
    starting is a RuntimeError."""
    rows, failed = {}, {}
    for name, command, env in in_turn(servers, i):
        print(f"run {i + 1}/{runs}: {' '.join(filter(None, (name, tag)))}", flush=True)
        port = free_port()
        log = logs / f"{'-'.join(filter(None, (name, tag)))}-{i}.log"
        try:
            with server(command(port), env, port, log, name) as url:
                rows[name] = measure(url)
        except PeerUnavailable as err:
            if name == "graft":
                raise RuntimeError(f"graft serve failed: {err}") from None
            failed[name] = err
    return rows, failed


@contextlib.contextmanager
def server(cmd: list[str], env: dict, port: int, log: Path, name: str):
    """The server's base URL once /health answers 200; the process is stopped on exit."""
    with server_process(cmd, env, port, log, name) as (url, _):
        yield url


@contextlib.contextmanager
def server_process(cmd: list[str], env: dict, port: int, log: Path, name: str):
    """server(), yielding (base URL, the server's Popen): a profiler attaches to its pid."""
    import httpx

    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        url = f"http://127.0.0.1:{port}"
        while True:
            if proc.poll() is not None:
                raise PeerUnavailable(f"{name} exited {proc.returncode} at start "
                                      f"({_last_line(log)}; log: {log})")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise PeerUnavailable(f"{name} not healthy in {START_TIMEOUT_S} s (log: {log})")
            time.sleep(0.5)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def load(url: str, requests: int, concurrency: int, max_tokens: int, seed: int,
         warmup: int | None = None) -> dict:
    """Output tok/s and TTFT p50/p99 (ms) of `graft bench serve` against `url`: text only, no
    encoder-cache probe, every answer `max_tokens` long (ignore_eos), after one warm-up request
    per client (whichever server a run measured first took this client's and its own
    first-call costs in its first wave: its p99 was the worst of the runs every time);
    `warmup` overrides that count (0: a caller that warmed the server up itself)."""
    from graft.benchmarks import serve

    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    args = parser.parse_args([url, "--model", "graft", "--num-requests", str(requests),
                              "--concurrency", str(concurrency), "--max-tokens", str(max_tokens),
                              "--image-ratio", "0", "--cache-probe", "0", "--seed", str(seed),
                              "--warmup", str(concurrency if warmup is None else warmup)])
    report = asyncio.run(serve.run_load(args))
    if report["completed"] < report["requests"]:
        raise PeerUnavailable(f"{url}: {report['completed']}/{report['requests']} requests "
                              f"completed ({report['sample_errors'][:1]})")
    return {"serve_output_tok_s": report["output_token_throughput"],
            "serve_ttft_p50_ms": report["ttft_ms"]["p50"],
            "serve_ttft_p99_ms": report["ttft_ms"]["p99"]}


def _last_line(log: Path) -> str:
    return failure_line(log.read_text(errors="replace"))[:200]
