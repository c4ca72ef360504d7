"""`graft bench serve --chaos` for a few seconds against a real server on loopback: every
kind of misbehaving client runs, every answer is the one its kind must get, no 5xx, and
afterwards no KV block or encoder-cache byte is held (the longer soak is not for CI)."""

import argparse

import pytest

from graft.benchmarks import serve, serve_chaos
from tests.serving.http.conftest import LiveServer


@pytest.fixture(scope="module")
def server(tiny_run_dir):
    from graft.serving.http import serve_cli

    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    args = parser.parse_args([str(tiny_run_dir), "--served-model-name", "tiny",
                              "--max-image-pixels", "4096", "--max-model-len", "256",
                              "--num-kv-blocks", "64", "--max-num-batched-tokens", "64",
                              "--header-timeout-s", "0.5"])
    with LiveServer(serve_cli.build(args), **serve_cli.uvicorn_options(args)) as live:
        yield live


def _args(url, *more):
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    return parser.parse_args([url, "--chaos", "--duration-s", "4", "--concurrency", "6",
                              "--max-tokens", "8", "--image-size", "32",
                              "--half-head-wait-s", "5", *more])


def test_chaos_soak_leaves_nothing_behind(server, tmp_path):
    import json

    out = tmp_path / "chaos.json"
    assert serve.run(_args(server.url, "--out", str(out))) == 0
    report = json.loads(out.read_text())
    assert report["passed"] and report["images"], report["unexpected"]
    assert report["after"] == {"kv_blocks_used": 0, "encoder_cache_pinned_bytes": 0,
                               "running_requests": 0, "queue_depth": 0}
    statuses = set(report["by_status"])
    assert {"200", "400"} <= statuses and not any(s.startswith("5") for s in statuses)
    assert report["by_kind"]["stream"]["n"] and report["by_kind"]["malformed"]["n"]
    assert report["requests_per_s"] > 0 and report["latency_ms"]["p99"] is not None


def test_every_malformed_body_is_refused_with_a_json_4xx(server):
    import httpx

    for i in range(serve_chaos._MALFORMED_KINDS):
        resp = httpx.post(server.url + serve_chaos.CHAT, content=serve_chaos.malformed("tiny", i),
                          headers={"content-type": "application/json"}, timeout=30)
        assert 400 <= resp.status_code < 500 and serve_chaos._is_error_body(resp), (i, resp.text)


def test_a_held_pin_or_a_5xx_fails_the_soak():
    ok = serve_chaos.Outcome("stream", 200, 0.1, True)
    idle = {"graft_kv_blocks_used": 0, "graft_encoder_cache_pinned_bytes": 0,
            "graft_running_requests": 0, "graft_queue_depth": 0}
    args = argparse.Namespace(url="http://x")

    def passed(outcomes, after):
        return serve_chaos.summarize(outcomes, 1.0, {}, after, 200, "m", True, args)["checks"]

    assert all(passed([ok], idle).values())
    assert not passed([ok], {**idle, "graft_encoder_cache_pinned_bytes": 1})["nothing_held_after"]
    bad = serve_chaos.Outcome("complete", 500, 0.1, False)
    assert not passed([ok, bad], idle)["no_5xx"]
