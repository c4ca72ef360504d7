"""Real routers in front of two graft workers (tiny Llama): vllm-router 0.1.17's cache_aware
routes on the ids /v1/chat/completions/render gives, and sglang-router 0.3.2 registers each
worker under its served model name and reads its load. The routers are the PyPI builds in
.venv-router and .venv-sglang-router (make router-venvs); without them these tests skip."""

from __future__ import annotations

import re
import socket
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.serving.http.conftest import LiveServer
from tests.serving.http.router_proc import ROOT, Router, free_port, vllm_router

SGLANG_ROUTER = ROOT / ".venv-sglang-router" / "bin" / "sglang-router"
SYSTEMS = {"A": "You are a ship's navigator; answer with bearings and distances only. " * 5,
           "B": "Tu es un cuisinier; reponds avec des recettes courtes et precises. " * 5}


@pytest.fixture(scope="module")
def workers(tiny_llama_2k):
    from graft.serving import Engine, EngineConfig
    from graft.serving.http.server import ServerSettings, build_app

    servers = [LiveServer(build_app(Engine.from_pretrained(tiny_llama_2k,
                                                           EngineConfig(num_kv_blocks=64)),
                                    ServerSettings(model_name="plain")))
               for _ in range(2)]
    with servers[0], servers[1]:
        yield servers


@contextmanager
def _router(argv: list[str], log: Path, timeout_s: float = 60.0):
    """The router (router_proc.Router) until the block ends; yields its URL once it answers
    a chat (its workers registered). Its metrics port is free too: routers beside it may run."""
    with Router([*argv, "--prometheus-port", str(free_port())], log) as router:
        end = time.monotonic() + timeout_s
        while _chat(router.url, "ready?").status_code != 200:  # no timing assertion
            assert time.monotonic() < end, router.text()[-3000:]
            time.sleep(0.3)
        yield router.url


def _chat(url: str, user: str, system: str | None = None) -> httpx.Response:
    msgs = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": user}]
    return httpx.post(url + "/v1/chat/completions", timeout=60, json={
        "model": "plain", "messages": msgs, "max_tokens": 1, "temperature": 0})


def _prefix_counters(server) -> tuple[float, float]:
    """(vllm:prefix_cache_queries_total, vllm:prefix_cache_hits_total) from a /metrics scrape."""
    text = httpx.get(server.url + "/metrics").text
    return tuple(float(re.search(rf'^vllm:prefix_cache_{name}_total\{{model_name="plain",'
                                 rf'engine="0"\}} (\S+)$', text, re.M).group(1))
                 for name in ("queries", "hits"))


def test_vllm_router_cache_aware_keeps_each_prefix_on_one_worker(workers, tmp_path):
    log = tmp_path / "vllm-router.log"
    argv = [vllm_router(), "--worker-urls", *[w.url for w in workers], "--policy",
            "cache_aware", "--log-level", "debug"]
    with _router(argv, log) as url:
        before = {w.url: _prefix_counters(w) for w in workers}
        sent = []  # (group, usage)
        for i in range(3):  # interleaved: A B A B A B
            for group, system in SYSTEMS.items():
                resp = _chat(url, f"question {i}", system)
                assert resp.status_code == 200, resp.text
                sent.append((group, resp.json()["usage"]))
        text = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text())
    # the router got our ids (a 404 on render logged render_unavailable and routed by load)
    assert "render_unavailable" not in text and "Prefix input preparation unavailable" not in text
    decisions = re.findall(r'Cache prefix decision.*?selected="([^"]+)" match_rate=([0-9.]+)',
                           text)[-len(sent):]  # the readiness probe's decision came first
    assert len(decisions) == len(sent)
    where: dict[str, set] = {}
    for (group, usage), (worker, rate), k in zip(sent, decisions, range(len(sent))):
        where.setdefault(group, set()).add(worker)
        if k >= len(SYSTEMS):  # a repeat: matched on the shared system prompt's ids ...
            assert float(rate) > 0.9, decisions
            assert usage["prompt_tokens_details"]["cached_tokens"] > 0  # ... and hit its KV
    assert all(len(ws) == 1 for ws in where.values()), where  # each group on one worker
    # the workers' vLLM-named prefix-cache counters add up to what the answers reported
    served = {w: [u for (g, u), (s, _) in zip(sent, decisions) if s == w] for w in before}
    for w in workers:
        queries, hits = (a - b for a, b in zip(_prefix_counters(w), before[w.url]))
        assert queries == sum(u["prompt_tokens"] for u in served[w.url])
        assert hits == sum(u["prompt_tokens_details"]["cached_tokens"] for u in served[w.url])


def test_vllm_router_cache_aware_routes_responses_on_their_render(workers, tmp_path):
    """/v1/responses behind cache_aware: the router renders each request on the workers
    (/v1/responses/render) and keeps a shared prefix on one worker, as for chats."""
    log = tmp_path / "vllm-router.log"
    argv = [vllm_router(), "--worker-urls", *[w.url for w in workers], "--policy",
            "cache_aware", "--log-level", "debug"]
    with _router(argv, log) as url:
        for i in range(2):
            for system in SYSTEMS.values():  # (prefixes of their own: the workers are shared)
                resp = httpx.post(url + "/v1/responses", timeout=60, json={
                    "model": "plain", "instructions": "Responses. " + system,
                    "input": f"question {i}", "max_output_tokens": 1, "temperature": 0})
                assert resp.status_code == 200 and resp.json()["object"] == "response", resp.text
                usage = resp.json()["usage"]
                if i:  # a repeat went where its instructions' KV is
                    assert usage["input_tokens_details"]["cached_tokens"] > \
                        0.8 * usage["input_tokens"], usage
        text = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text())
    assert "render_unavailable" not in text and "Prefix input preparation unavailable" not in text
    rates = re.findall(r'Cache prefix decision.*?match_rate=([0-9.]+)', text)[-4:]
    assert [float(r) > 0.9 for r in rates] == [False, False, True, True], rates


def test_vllm_router_passes_embeddings_and_rerank_through(workers, tmp_path):
    """/v1/embeddings and /v1/rerank behind vllm-router: answered by a worker as it answers
    alone. (The router renders chats, completions and Responses only; these it routes by
    load, its log says `unsupported_route`, never a worker's missing render.) The router
    speaks SGLang's rerank protocol to the worker (`rid`, the model renamed "default", a list
    back); the client gets the same order, scores and token counts."""
    log = tmp_path / "vllm-router.log"
    argv = [vllm_router(), "--worker-urls", *[w.url for w in workers], "--policy",
            "cache_aware", "--log-level", "debug"]
    body = {"model": "plain", "input": ["a red car", "a blue boat"], "encoding_format": "float"}
    ranking = {"model": "plain", "query": "a red car", "documents": ["a blue boat", "a red car"]}
    with _router(argv, log) as url:
        routed = [httpx.post(url + "/v1/embeddings", json=body, timeout=60) for _ in range(4)]
        ranked = httpx.post(url + "/v1/rerank", json=ranking, timeout=60)
        text = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text())
    direct = httpx.post(workers[0].url + "/v1/embeddings", json=body, timeout=60).json()
    alone = httpx.post(workers[0].url + "/v1/rerank", json=ranking, timeout=60).json()
    assert ranked.status_code == 200, ranked.text
    results = ranked.json()["results"]
    assert [r["index"] for r in results] == [r["index"] for r in alone["results"]]
    for got, want in zip(results, alone["results"]):
        assert abs(got["score"] - want["relevance_score"]) < 1e-6
        assert got["document"] == want["document"]["text"]
    assert sum(r["meta_info"]["prompt_tokens"] for r in results) > alone["usage"]["prompt_tokens"]
    for resp in routed:
        assert resp.status_code == 200, resp.text
        got = resp.json()
        assert got["usage"] == direct["usage"]
        for a, b in zip(got["data"], direct["data"]):
            assert a["index"] == b["index"]
            assert max(abs(x - y) for x, y in zip(a["embedding"], b["embedding"])) < 1e-6
    assert "render_unavailable" not in text


@pytest.mark.skipif(not SGLANG_ROUTER.exists(), reason=f"sglang-router 0.3.2 not installed at "
                    f"{SGLANG_ROUTER} (make router-venvs)")
def test_sglang_router_registers_the_served_model_and_reads_load(workers, tmp_path):
    argv = [str(SGLANG_ROUTER), "launch", "--worker-urls", *[w.url for w in workers],
            "--policy", "power_of_two", "--log-level", "info"]
    with _router(argv, tmp_path / "sglang-router.log") as url:
        listed = httpx.get(url + "/workers", timeout=30).json()["workers"]
        assert sorted(w["url"] for w in listed) == sorted(w.url for w in workers)
        assert {w["model_id"] for w in listed} == {"plain"}  # was "unknown"
        assert {w["connection_mode"] for w in listed} == {"HTTP"}
        assert [m["id"] for m in httpx.get(url + "/v1/models").json()["data"]] == ["plain"]
        # the router's own view of every worker's /get_load (-1: it could not read one)
        loads = httpx.get(url + "/get_loads", timeout=30).json()["workers"]
        assert sorted(x["worker"] for x in loads) == sorted(w.url for w in workers)
        assert all(x["load"] >= 0 for x in loads), loads  # -1: /get_load unreadable
        # rerank in SGLang's protocol (its model "unknown" is the one model served)
        ranking = {"model": "plain", "query": "a red car", "documents": ["a boat", "a red car"]}
        ranked = httpx.post(url + "/v1/rerank", json=ranking, timeout=60)
        assert ranked.status_code == 200, ranked.text
    alone = httpx.post(workers[0].url + "/v1/rerank", json=ranking, timeout=60).json()
    scores = {r["index"]: r["score"] for r in ranked.json()["results"]}
    assert scores == pytest.approx({r["index"]: r["relevance_score"] for r in alone["results"]},
                                   abs=1e-6)


def test_http2_preface_is_refused_and_the_worker_keeps_serving(workers):
    """sglang-router probes each worker over gRPC (HTTP/2 prior knowledge) beside its HTTP
    /health probe and keeps HTTP when /health answers: graft refuses the preface with a
    plain HTTP/1.1 error and closes, as docs/fleet.md says."""
    host, port = workers[0].url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        head = conn.recv(4096)
    assert re.match(rb"HTTP/1\.1 4\d\d ", head), head[:200]
    assert httpx.get(workers[0].url + "/health").status_code == 200
