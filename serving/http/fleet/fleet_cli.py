"""`graft fleet PATH --replicas N`: N `graft serve` workers on this machine, the CPUs split
between them, behind vllm-router on one port, with cache-aware routing (or another policy,
or a prefill/decode split with --pd P:D). Ctrl-C stops everything. graft writes no router
of its own: the router is vllm-router from PyPI (`pip install 'graft-vlm[fleet]'`)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from graft.cli_types import number_in
from graft.subprocess_argv import graft_argv

POLICIES = ("cache_aware", "kv_aware", "round_robin", "power_of_two", "consistent_hash",
            "random")
EXAMPLES = """examples:
  graft fleet ~/.cache/graft/smollm2-135m-instruct --replicas 2 --port 8000
  graft fleet runs/quickstart --pd 1:1 -- --max-model-len 4096"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="a run dir, LLM dir or GGUF file, as for graft serve")
    p.add_argument("--replicas", type=number_in(int, low=1), default=2,
                   help="graft serve workers (default 2); with --pd, P+D of them")
    p.add_argument("--pd", default=None, metavar="P:D",
                   help="a prefill/decode split: P prefill and D decode workers "
                        "(vllm-router --vllm-pd-disaggregation)")
    p.add_argument("--policy", choices=POLICIES, default="cache_aware",
                   help="vllm-router's policy (default cache_aware; kv_aware reads the "
                        "workers' KV events)")
    p.add_argument("--host", default="127.0.0.1", help="where the router listens")
    p.add_argument("--port", type=number_in(int, low=1, high=65535), default=8000,
                   help="the router's port (default 8000)")
    p.add_argument("--worker-port", type=number_in(int, low=1, high=65535), default=None,
                   help="the first worker's port (default --port + 1; the others follow)")
    p.add_argument("--cpus", default=None, metavar="LIST",
                   help="CPUs to split between the workers, e.g. 0-7 (default: all this "
                        "process may use)")
    p.add_argument("--no-encoder-cache-peers", dest="encoder_cache_peers",
                   action="store_false", help="workers do not ask each other for image "
                   "embeddings before encoding (they do by default; docs/fleet.md)")
    p.add_argument("--router", default=None, metavar="PATH",
                   help="the vllm-router binary (default: $GRAFT_VLLM_ROUTER, then the one "
                        "beside this Python, then PATH)")
    p.add_argument("--startup-timeout-s", type=number_in(float, low=0.0, low_open=True),
                   default=900.0,
                   help="how long workers and router may take to answer /health")
    p.epilog = (p.epilog or "") + "\n\nOptions after -- go to every graft serve worker."


def parse_args(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """What follows `--` goes to every `graft serve` worker as it is."""
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    args.serve_args = argv[cut + 1:]
    return args


@dataclass
class Process:
    name: str  # "worker 0 (prefill)", "router"
    url: str
    argv: list[str]
    env: dict = field(default_factory=dict)
    cpus: list[int] = field(default_factory=list)


@dataclass
class FleetPlan:
    workers: list[Process]
    router: Process


def plan(args: argparse.Namespace, cpus: list[int], router_bin: str,
         new_port=None) -> FleetPlan:
    """Every process's command line, CPUs and environment (pure: tests check it)."""
    from graft.errors import GraftConfigError
    from graft.serving.engine.config import EngineConfig

    new_port = new_port or free_port
    roles = _roles(args)
    n = len(roles)
    base = args.worker_port or args.port + 1
    if base + n - 1 > 65535:
        raise GraftConfigError(f"--worker-port {base}: {n} workers need ports up to "
                               f"{base + n - 1}; pick a lower one")
    extra = list(args.serve_args or [])
    # one value for every worker would collide (ports, endpoints) or be overridden
    for flag, how in (("--port", "--worker-port"), ("--host", "--host (the router's)"),
                      ("--kv-transfer-config", "--pd P:D"),
                      ("--kv-events-config", "--policy kv_aware"),
                      ("--encoder-cache-peers", "--no-encoder-cache-peers to turn it off")):
        if any(a == flag or a.startswith(flag + "=") for a in extra):
            raise GraftConfigError(f"{flag} after --: graft fleet sets it for each worker "
                                   f"(see {how}); leave it out")
    workers = []
    # decode workers pull KV only from the prefill workers named here (fleet/pd.py)
    peers = [f"127.0.0.1:{base + i}" for i, role in enumerate(roles) if role == "kv_producer"]
    for i, (role, mine) in enumerate(zip(roles, _split(cpus, n))):
        port = base + i
        argv = graft_argv("serve", str(args.path), "--host", "127.0.0.1", "--port", str(port), *extra)
        if role is not None:
            config = {"kv_role": role}
            if role == "kv_consumer":
                config["kv_connector_extra_config"] = {"prefill_peers": peers}
            argv += ["--kv-transfer-config", json.dumps(config, separators=(",", ":"))]
        if args.policy == "kv_aware":
            argv += ["--kv-events-config", _kv_events_config(new_port())]
        if n > 1 and getattr(args, "encoder_cache_peers", True):
            # each worker asks the others before it encodes an image
            argv += ["--encoder-cache-peers", *(f"http://127.0.0.1:{base + k}"
                                                for k in range(n) if k != i)]
        name = f"worker {i}" + {"kv_producer": " (prefill)", "kv_consumer": " (decode)"}.get(
            role, "")
        workers.append(Process(name, f"http://127.0.0.1:{port}", argv,
                               {"OMP_NUM_THREADS": str(len(mine))}, mine))
    router = [router_bin, "--host", args.host, "--port", str(args.port),
              "--policy", args.policy, "--prometheus-port", str(new_port())]
    if args.pd:
        router.append("--vllm-pd-disaggregation")
        for w, role in zip(workers, roles):
            router += ["--prefill" if role == "kv_producer" else "--decode", w.url]
    else:
        router += ["--worker-urls", *(w.url for w in workers)]
    if args.policy == "kv_aware":
        for w in workers:
            router += ["--kv-event-source", f"{w.url}={_endpoint(w.argv)}"]
        router += ["--kv-event-model", _option(extra, "--served-model-name",
                                               Path(args.path).resolve().name),
                   "--kv-event-block-size", _option(extra, "--block-size",
                                                    str(EngineConfig().block_size))]
    host = f"[{args.host}]" if ":" in args.host else args.host  # an IPv6 address
    return FleetPlan(workers, Process("router", f"http://{host}:{args.port}", router))


def _roles(args) -> list[str | None]:
    from graft.errors import GraftConfigError

    if not args.pd:
        return [None] * args.replicas
    try:
        p, d = (int(x) for x in args.pd.split(":"))
    except ValueError:
        p = d = 0
    if p < 1 or d < 1:
        raise GraftConfigError(f"--pd {args.pd!r}: give P:D, at least one of each, e.g. 1:1")
    return ["kv_producer"] * p + ["kv_consumer"] * d


def _split(cpus: list[int], n: int) -> list[list[int]]:
    """n shares of the CPUs, as equal as they come; with fewer CPUs than workers, they share."""
    if n <= len(cpus):
        per, rest = divmod(len(cpus), n)
        out, k = [], 0
        for i in range(n):
            size = per + (i < rest)
            out.append(cpus[k:k + size])
            k += size
        return out
    return [[cpus[i % len(cpus)]] for i in range(n)]


def _option(argv: list[str], flag: str, default: str) -> str:
    """The value a worker gets for `flag` (the last one given), else the default."""
    found = default
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            found = argv[i + 1]
        elif arg.startswith(flag + "="):
            found = arg.split("=", 1)[1]
    return found


def _kv_events_config(port: int) -> str:
    # "*": the worker binds its PUB socket (vLLM's rule); the router connects to it
    return f'{{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:{port}"}}'


def _endpoint(argv: list[str]) -> str:
    """Where the router subscribes to a worker's KV events."""
    config = argv[argv.index("--kv-events-config") + 1]
    return config.split('"endpoint": "')[1].split('"')[0].replace("*", "127.0.0.1")


def find_router(given: str | None) -> str:
    from graft.errors import GraftConfigError

    def runnable(path) -> bool:
        return bool(path) and Path(path).is_file() and os.access(path, os.X_OK)

    if given is not None:  # named by the user: never silently replaced by another router
        given = given if runnable(given) else shutil.which(given) or given  # a bare name: PATH
        if not runnable(given):
            raise GraftConfigError(f"--router {given}: no executable file there; give the "
                                   "vllm-router binary's path")
        return given
    for candidate in (os.environ.get("GRAFT_VLLM_ROUTER"),
                      str(Path(sys.executable).with_name("vllm-router")),
                      shutil.which("vllm-router")):
        if runnable(candidate):
            return candidate
    raise GraftConfigError("vllm-router not found: pip install 'graft-vlm[fleet]' (vllm-router "
                           "0.1.17), or pass --router PATH")


def parse_cpus(text: str | None) -> list[int]:
    from graft.errors import GraftConfigError

    if text is None:
        return sorted(os.sched_getaffinity(0))
    cpus: set[int] = set()
    try:
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise GraftConfigError(f"--cpus {text!r}: give a list like 0-3,6") from None
    allowed = os.sched_getaffinity(0)
    if not cpus or not cpus <= allowed:
        raise GraftConfigError(f"--cpus {text!r}: this process may use CPUs "
                               f"{_ranges(sorted(allowed))}")
    return sorted(cpus)


class FleetError(RuntimeError):
    """A process of the fleet exited or did not start in time (the message says which)."""


class Running:
    """The fleet's processes, started in order (workers, then the router once every worker
    answers /health) and stopped together; the workers' and router's output goes to
    `log_dir` when one is given (else the workers' to this terminal)."""

    def __init__(self, fleet: FleetPlan, timeout_s: float, log_dir: Path | None = None,
                 stopping: list | None = None):
        self.fleet, self.timeout_s, self.log_dir = fleet, timeout_s, log_dir
        self.stopping = stopping if stopping is not None else []
        self.procs: list[tuple[Process, subprocess.Popen]] = []
        self.router_log: str | None = None

    def __enter__(self) -> "Running":
        try:
            for i, w in enumerate(self.fleet.workers):
                self.procs.append((w, _start(w, self._log(f"worker{i}.log"))))
            self._wait_healthy(self.procs)
            log = self._log("router.log") or tempfile.NamedTemporaryFile(
                "w", prefix="graft-fleet-router-", suffix=".log", delete=False)
            self.router_log = log.name
            self.procs.append((self.fleet.router, _start(self.fleet.router, log)))
            self._wait_healthy(self.procs[-1:])
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        for _, popen in reversed(self.procs):
            if popen.poll() is None:
                popen.terminate()
        for _, popen in self.procs:
            try:
                popen.wait(timeout=20)
            except subprocess.TimeoutExpired:
                popen.kill()

    def check(self) -> None:
        """FleetError when any process has exited."""
        for proc, popen in self.procs:
            if popen.poll() is not None:
                raise FleetError(f"{proc.name} exited ({popen.returncode})")

    def _log(self, name: str):
        return open(self.log_dir / name, "w") if self.log_dir is not None else None

    def _wait_healthy(self, procs) -> None:
        import httpx

        end = time.monotonic() + self.timeout_s
        waiting = list(procs)
        while waiting and not self.stopping:
            for proc, popen in list(waiting):
                if popen.poll() is not None:
                    raise FleetError(f"{proc.name} exited ({popen.returncode}) while starting")
                try:
                    if httpx.get(proc.url + "/health", timeout=2).status_code == 200:
                        waiting.remove((proc, popen))
                except httpx.HTTPError:
                    pass
            if waiting and time.monotonic() > end:
                raise FleetError(f"{waiting[0][0].name} did not answer /health within "
                                 f"{self.timeout_s:g} s (--startup-timeout-s)")
            time.sleep(0.2)


def run(args: argparse.Namespace) -> int:
    from graft.gguf_llm import gguf_llm_dir, is_gguf_file
    from graft.serving.http.serve_cli import check_port_free

    check_port_free(args.host, args.port)
    _roles(args)  # a bad --pd is named before the router is looked for
    fleet = plan(args, parse_cpus(args.cpus), find_router(args.router))
    if is_gguf_file(args.path):  # read once here, not by every worker at once
        gguf_llm_dir(args.path, log=print)
    stopping: list = []
    signal.signal(signal.SIGINT, lambda *_: stopping.append(True))
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    try:
        with Running(fleet, args.startup_timeout_s, stopping=stopping) as running:
            if stopping:
                return 0
            print(f"graft fleet: {fleet.router.url}/v1 ({args.policy}"
                  f"{', P/D ' + args.pd if args.pd else ''}); Ctrl-C stops everything")
            for w in fleet.workers:
                print(f"  {w.name}: {w.url} on CPUs {_ranges(w.cpus)}, metrics {w.url}/metrics")
            print(f"  router log: {running.router_log}")
            sys.stdout.flush()
            while not stopping:
                running.check()
                time.sleep(0.5)
        return 0
    except FleetError as err:
        print(f"graft fleet: {err}; stopping the rest", file=sys.stderr)
        return 1


def _start(proc: Process, log=None) -> subprocess.Popen:
    cpus = proc.cpus
    return subprocess.Popen(proc.argv, env={**os.environ, **proc.env}, stdout=log,
                            stderr=subprocess.STDOUT if log else None,
                            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_run(n: int) -> int:
    """The first of n consecutive free ports (a router's, then its workers': --port + 1 on),
    taken below the kernel's range for outgoing connections: a port there, free when checked,
    could be some connection's own by the time a worker that loads for seconds binds it."""
    import random

    low = _ephemeral_low()
    for _ in range(100):
        base = random.randint(10000, max(10000, low - n - 1)) if low > 10000 + n else free_port()
        socks = [socket.socket() for _ in range(n)]
        try:
            for k, s in enumerate(socks):
                s.bind(("127.0.0.1", base + k))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports on 127.0.0.1")


def _ephemeral_low() -> int:
    """The first port the kernel hands to outgoing connections (Linux; 32768 elsewhere)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _ranges(cpus: list[int]) -> str:
    out, start = [], None
    for i, c in enumerate(cpus):
        if start is None:
            start = c
        if i + 1 == len(cpus) or cpus[i + 1] != c + 1:
            out.append(f"{start}" if start == c else f"{start}-{c}")
            start = None
    return ",".join(out)
