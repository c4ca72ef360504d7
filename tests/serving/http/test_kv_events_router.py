"""vllm-router's kv_aware policy (the real router, 0.1.17) over two graft workers publishing KV
events: chats sharing a system prompt go to the worker whose prefix cache holds it. Skips,
saying why, when vllm-router or the fleet extra is not installed."""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("zmq", reason="the fleet extra (pyzmq, msgspec) is not installed")
pytest.importorskip("msgspec", reason="the fleet extra (pyzmq, msgspec) is not installed")

from tests.serving.http.conftest import LiveServer, _free_port  # noqa: E402

BS = 16  # vllm-router's --kv-event-block-size default, given explicitly below


def _router_binary() -> str | None:
    for candidate in (os.environ.get("GRAFT_VLLM_ROUTER"),
                      str(Path(__file__).parents[3] / ".venv-router" / "bin" / "vllm-router"),
                      str(Path(sys.executable).with_name("vllm-router")),
                      shutil.which("vllm-router")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


ROUTER = _router_binary()
pytestmark = pytest.mark.skipif(ROUTER is None, reason="vllm-router not installed (pip install "
                                "vllm-router==0.1.17 into .venv-router, or $GRAFT_VLLM_ROUTER)")


def _worker(llm_dir, events_port):
    from graft.serving.http import serve_cli

    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    config = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                         "endpoint": f"tcp://*:{events_port}"})
    args = parser.parse_args([str(llm_dir), "--served-model-name", "tiny",
                              "--max-model-len", "1024", "--num-kv-blocks", "256",
                              "--block-size", str(BS), "--kv-events-config", config])
    return LiveServer(serve_cli.build(args))


@pytest.fixture(scope="module")
def fleet(tiny_llama_2k, tmp_path_factory):
    ports = [_free_port(), _free_port()]
    with _worker(tiny_llama_2k, ports[0]) as a, _worker(tiny_llama_2k, ports[1]) as b:
        port = _free_port()
        argv = [ROUTER, "--host", "127.0.0.1", "--port", str(port),
                "--prometheus-port", str(_free_port()), "--policy", "kv_aware",
                "--worker-urls", a.url, b.url, "--kv-event-model", "tiny",
                "--kv-event-block-size", str(BS)]
        for server, events_port in zip((a, b), ports):
            argv += ["--kv-event-source", f"{server.url}=tcp://127.0.0.1:{events_port}"]
        log = tmp_path_factory.mktemp("router") / "router.log"
        with open(log, "wb") as out:
            router = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(600):  # until it answers (no timing assertion)
                if router.poll() is not None:
                    pytest.fail(f"vllm-router exited {router.returncode}: {log.read_text()}")
                try:
                    if httpx.get(url + "/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
            else:
                pytest.fail(f"vllm-router did not answer /health: {log.read_text()[-3000:]}")
            yield url, (a, b), log
        finally:
            router.terminate()
            router.wait(timeout=20)
            for server in (a, b):
                server.app.state.kv_events.shutdown()


def _chat(url, system, user):
    body = {"model": "tiny", "max_tokens": 2, "temperature": 0,
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": user}]}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r


def _prompts_seen(servers):
    return [s.app.state.ctx.engine.block_manager.query_tokens for s in servers]


def _system(tag: str) -> str:
    return f"You are assistant {tag}. " + " ".join(f"rule {tag}{i}: answer kindly." for i in range(12))


def _routed_to(url, servers, system, user) -> int:
    before = _prompts_seen(servers)
    _chat(url, system, user)
    after = _prompts_seen(servers)
    moved = [i for i, (x, y) in enumerate(zip(before, after)) if y > x]
    assert len(moved) == 1, (before, after)
    return moved[0]


def test_kv_aware_routes_a_shared_prefix_to_the_worker_holding_it(fleet):
    url, servers, log = fleet
    # the router's subscriptions connect in the background: prime each worker directly with a
    # prefix of its own until a chat through the router finds both (retries, no timing)
    ready = [False, False]
    for k in range(40):
        for i, server in enumerate(servers):
            if not ready[i]:
                system = _system(f"ready{k}w{i}")
                _chat(server.url, system, "hello")
                ready[i] = _routed_to(url, servers, system, "and again") == i
        if all(ready):
            break
    assert all(ready), log.read_text()[-3000:]

    # fresh prefixes, one held by each worker: every chat of a group goes to its holder
    groups = {i: _system(f"group{i}") for i in range(2)}
    for i, system in groups.items():
        _chat(servers[i].url, system, "prime")
    for turn in range(3):
        for i, system in groups.items():
            assert _routed_to(url, servers, system, f"question {turn}") == i
