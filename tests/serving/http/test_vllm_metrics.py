"""/metrics under vLLM's names beside graft's own: the families, types, labels and buckets
of vllm/v1/metrics/loggers.py, a valid exposition, and values that move with what the
answers report (usage.prompt_tokens, cached_tokens, one gap per output token)."""

from __future__ import annotations

import re
from collections import defaultdict

import httpx

from graft.serving.http.plumbing import vllm_metrics as V

LABELS = {"model_name": "plain", "engine": "0"}
FAMILIES = {  # vLLM's name -> Prometheus type
    "vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge", "vllm:prefix_cache_queries_total": "counter",
    "vllm:prefix_cache_hits_total": "counter", "vllm:prompt_tokens_total": "counter",
    "vllm:generation_tokens_total": "counter", "vllm:request_success_total": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:time_per_output_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram"}
# the buckets in vLLM's loggers.py, written out again here so a slip in either copy shows
BUCKETS = {
    "vllm:time_to_first_token_seconds": [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25,
                                         0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
                                         160.0, 640.0, 2560.0],
    "vllm:inter_token_latency_seconds": [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
                                         0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0],
    "vllm:e2e_request_latency_seconds": [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0,
                                         20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
                                         960.0, 1920.0, 7680.0]}
BUCKETS["vllm:time_per_output_token_seconds"] = BUCKETS["vllm:inter_token_latency_seconds"]
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def scrape(server) -> tuple[dict[str, str], list[tuple[str, dict, float]]]:
    """(family -> type, samples) of a /metrics scrape, checking the text format: every sample
    belongs to a family whose TYPE came before it, each family declared once."""
    text = httpx.get(server.url + "/metrics").text
    types: dict[str, str] = {}
    samples = []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert name not in types, f"{name} declared twice"
            types[name] = kind
        elif line and not line.startswith("#"):
            name, labels, value = _SAMPLE.match(line).groups()
            family = re.sub(r"_(bucket|sum|count)$", "", name) if name not in types else name
            assert family in types, f"sample {name} before its TYPE"
            samples.append((name, dict(_LABEL.findall(labels or "")), float(value)))
    return types, samples


def value(samples, name, **labels) -> float:
    (v,) = [v for n, lab, v in samples if n == name and lab == {**LABELS, **labels}]
    return v


def test_vllm_families_types_labels_and_buckets(plain_server):
    types, samples = scrape(plain_server)
    for name, kind in FAMILIES.items():
        assert types.get(name) == kind, name
    assert "graft_requests_total" in types and "graft_kv_blocks_used" in types  # kept
    for name, labels, _ in samples:
        if name.startswith("vllm:"):
            assert {k: labels[k] for k in LABELS} == LABELS, (name, labels)
    reasons = {lab["finished_reason"] for n, lab, _ in samples
               if n == "vllm:request_success_total"}
    assert reasons == {"stop", "length", "abort", "error"}  # present from the start, as in vLLM
    for name, bounds in BUCKETS.items():
        les = [lab["le"] for n, lab, _ in samples if n == name + "_bucket"]
        assert les == [repr(b) for b in bounds] + ["+Inf"], name
        assert list(getattr(V, {"vllm:time_to_first_token_seconds": "TTFT_BUCKETS",
                                "vllm:e2e_request_latency_seconds": "E2E_BUCKETS"}.get(
                                    name, "ITL_BUCKETS"))) == bounds
    assert value(samples, "vllm:num_requests_running") == 0
    assert value(samples, "vllm:num_requests_waiting") == 0
    assert 0.0 <= value(samples, "vllm:kv_cache_usage_perc") <= 1.0


def _deltas(before, after) -> dict:
    out = defaultdict(float)
    for (n, lab, v) in after:
        out[n, tuple(sorted(lab.items()))] += v
    for (n, lab, v) in before:
        out[n, tuple(sorted(lab.items()))] -= v
    return out


def _delta(d, name, **labels) -> float:
    return d[name, tuple(sorted({**LABELS, **labels}.items()))]


def test_vllm_series_follow_the_answers(plain_server):
    system = "A shared system prompt for the metrics test, long enough to fill blocks. " * 4
    body = {"model": "plain", "max_tokens": 5, "ignore_eos": True, "temperature": 0,
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": "one"}]}
    usages = []
    _, before = scrape(plain_server)
    for user in ("one", "two"):
        body["messages"][1]["content"] = user
        resp = httpx.post(plain_server.url + "/v1/chat/completions", json=body, timeout=60)
        assert resp.status_code == 200 and resp.json()["choices"][0]["finish_reason"] == "length"
        usages.append(resp.json()["usage"])
    _, after = scrape(plain_server)
    d = _deltas(before, after)
    prompt = sum(u["prompt_tokens"] for u in usages)
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    assert cached > 0  # the second found the shared system prompt
    assert _delta(d, "vllm:request_success_total", finished_reason="length") == 2
    assert _delta(d, "vllm:request_success_total", finished_reason="stop") == 0
    assert _delta(d, "vllm:prompt_tokens_total") == prompt
    assert _delta(d, "vllm:generation_tokens_total") == 10
    assert _delta(d, "vllm:prefix_cache_queries_total") == prompt  # in tokens, as vLLM counts
    assert _delta(d, "vllm:prefix_cache_hits_total") == cached
    assert _delta(d, "vllm:time_to_first_token_seconds_count") == 2
    assert _delta(d, "vllm:e2e_request_latency_seconds_count") == 2
    # one gap per output after the first: 4 per request (no speculation here)
    assert _delta(d, "vllm:inter_token_latency_seconds_count") == 8
    assert _delta(d, "vllm:time_per_output_token_seconds_count") == 8
    # the graft_* twins saw the same events
    assert _delta(d, "vllm:prompt_tokens_total") == d["graft_prompt_tokens_total", ()]
    for name in ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds"):
        buckets = [v for n, lab, v in after if n == name + "_bucket"]
        assert buckets == sorted(buckets)  # cumulative
        assert buckets[-1] == value(after, name + "_count")


def test_a_fresh_server_has_queried_nothing(tiny_llama):
    """The warmup's prompts are nobody's: no prefix-cache queries, no cached blocks."""
    from graft.serving import Engine, EngineConfig
    from graft.serving.http.server import ServerSettings, build_app
    from tests.serving.http.conftest import LiveServer

    engine = Engine.from_pretrained(tiny_llama, EngineConfig(num_kv_blocks=32))
    with LiveServer(build_app(engine, ServerSettings(model_name="plain"))) as server:
        _, samples = scrape(server)
        assert value(samples, "vllm:prefix_cache_queries_total") == 0
        assert value(samples, "vllm:prefix_cache_hits_total") == 0
        assert not engine.block_manager.cache and engine.kv_usage()[0] == 0
