"""`graft serve`'s periodic stats line (vLLM-style) and --log-format json, read from a real
server's metrics after real requests; the clock is injected, so nothing depends on speed."""

import argparse
import base64
import io
import json
import logging

import httpx
import pytest
from PIL import Image

from graft.serving.http import serve_cli
from graft.serving.http.plumbing import stats_log
from tests.serving.http.conftest import LiveServer


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def _args(*extra):
    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    return parser.parse_args(list(extra))


def _image_url() -> str:
    buf = io.BytesIO()
    Image.new("RGB", (32, 32), (200, 30, 30)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def server(tiny_run_dir):
    app = serve_cli.build(_args(str(tiny_run_dir), "--served-model-name", "tiny",
                                "--max-model-len", "256", "--num-kv-blocks", "64"))
    with LiveServer(app) as live:
        yield live


def _chat(server, with_image: bool):
    content = [{"type": "text", "text": "What colour?"}]
    if with_image:
        content.insert(0, {"type": "image_url", "image_url": {"url": _image_url()}})
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
        "model": "tiny", "max_tokens": 5, "temperature": 0, "ignore_eos": True,
        "messages": [{"role": "user", "content": content}]})
    assert r.status_code == 200, r.text
    return r.json()["usage"]


def test_stats_line_reports_the_interval(server, caplog):
    metrics = server.app.state.ctx.metrics
    clock = Clock()
    stats = stats_log.StatsLogger(metrics, interval_s=10, clock=clock)
    usages = [_chat(server, True), _chat(server, True)]  # the same image twice: one hit
    clock.t += 4.0
    with caplog.at_level(logging.INFO, logger=stats_log.LOGGER):
        s = stats.tick()
    prompt = sum(u["prompt_tokens"] for u in usages)
    generated = sum(u["completion_tokens"] for u in usages)
    assert s["prompt_tokens_per_s"] == pytest.approx(prompt / 4.0)
    assert s["generation_tokens_per_s"] == pytest.approx(generated / 4.0) and generated == 10
    assert s["finished"] == 2 and s["running"] == 0 and s["waiting"] == 0
    assert s["encoder_cache_hit_rate_interval"] == 0.5
    assert 0.0 <= s["kv_cache_usage"] <= 1.0
    line = caplog.records[-1].getMessage()
    assert line.startswith(f"Avg prompt throughput: {prompt / 4.0:.1f} tokens/s, "
                           f"Avg generation throughput: {generated / 4.0:.1f} tokens/s, "
                           "Running: 0 reqs, Waiting: 0 reqs, Finished: 2 reqs, KV cache usage: ")
    assert "Encoder cache hit rate: " in line

    # idle: one line saying so, then silence until something happens
    clock.t += 10
    with caplog.at_level(logging.INFO, logger=stats_log.LOGGER):
        assert stats.tick()["finished"] == 0
        clock.t += 10
        assert stats.tick() is None
        _chat(server, False)
        clock.t += 10
        assert stats.tick()["finished"] == 1


def test_json_formatter_one_object_per_line():
    record = logging.LogRecord(stats_log.LOGGER, logging.INFO, __file__, 1, "Avg %s", ("x",), None)
    record.stats = {"running": 2, "kv_cache_usage": 0.25}
    row = json.loads(stats_log.JsonFormatter().format(record))
    assert row["message"] == "Avg x" and row["level"] == "INFO" and row["logger"] == stats_log.LOGGER
    assert row["running"] == 2 and row["kv_cache_usage"] == 0.25 and row["time"].endswith("+00:00")


def test_periodic_thread_logs_until_stopped(server, caplog):
    with caplog.at_level(logging.INFO, logger=stats_log.LOGGER):
        with stats_log.periodic(server.app.state.ctx.metrics, 0.01) as logger:
            _chat(server, False)
            for _ in range(500):  # until the thread has logged the request (no timing bound)
                if any("Finished: 1 reqs" in r.getMessage() for r in caplog.records):
                    break
                logger._stop.wait(0.01)
        assert not logger._thread.is_alive()
    assert any("Finished: 1 reqs" in r.getMessage() for r in caplog.records)
    with stats_log.periodic(server.app.state.ctx.metrics, 0) as off:
        assert off is None


def test_flags_are_checked():
    assert _args("x").log_interval == 10.0 and _args("x").log_format == "text"
    for bad in (["--log-interval", "-1"], ["--log-format", "xml"]):
        with pytest.raises(SystemExit):
            _args("x", *bad)


def test_log_level_is_one_of_uvicorns_in_one_line(capsys):
    """A level uvicorn does not know was a KeyError traceback once the model had loaded."""
    from uvicorn.config import LOG_LEVELS

    from graft.cli import main

    assert set(serve_cli.LOG_LEVELS) == set(LOG_LEVELS)
    assert _args("x", "--log-level", "INFO").log_level == "info"
    assert main(["serve", "no-such-dir", "--log-level", "verbose"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "argument --log-level: invalid choice: 'verbose'" in err


@pytest.fixture
def restore_loggers():
    """configure() sets handlers on graft's serving loggers: undo it for the other tests."""
    names = ("graft.serving", stats_log.LOGGER)
    saved = {n: (logging.getLogger(n).handlers[:], logging.getLogger(n).propagate,
                 logging.getLogger(n).level) for n in names}
    yield
    for n, (handlers, propagate, level) in saved.items():
        logger = logging.getLogger(n)
        logger.handlers[:], logger.propagate = handlers, propagate
        logger.setLevel(level)


def test_configure_json_covers_uvicorn_and_graft(restore_loggers, capsys):
    cfg = stats_log.configure("json", "info")
    assert set(cfg["loggers"]) == {"uvicorn", "uvicorn.error", "uvicorn.access"}
    assert cfg["formatters"]["json"]["()"] is stats_log.JsonFormatter
    logging.getLogger("graft.serving").error("engine step failed")
    stats_log.announce("graft serve: up", "json")
    rows = [json.loads(ln) for ln in capsys.readouterr().err.splitlines()]
    assert [(r["level"], r["message"]) for r in rows] == [
        ("ERROR", "engine step failed"), ("INFO", "graft serve: up")]
    assert rows[1]["event"] == "startup"
    assert stats_log.configure("text", "warning") is None
    stats_log.announce("graft serve: up", "text")
    assert capsys.readouterr().out == "graft serve: up\n"


def test_graft_serve_process_logs_json_lines(tiny_run_dir):
    """The real command: every stderr line is one JSON object (startup, uvicorn, stats)."""
    import subprocess
    import sys

    from tests.serving.http.conftest import _free_port

    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "graft.cli", "serve", str(tiny_run_dir), "--port", str(port),
         "--served-model-name", "tiny", "--max-model-len", "256", "--num-kv-blocks", "64",
         "--log-format", "json", "--log-interval", "0.2", "--log-level", "info"],
        stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    import threading

    watchdog = threading.Timer(180, proc.kill)  # a hung server ends the read loop, not CI
    watchdog.start()
    rows = []
    try:
        for line in proc.stderr:  # until the stats line has counted our request
            rows.append(json.loads(line))
            if "Uvicorn running" in rows[-1]["message"]:
                r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=60, json={
                    "model": "tiny", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]})
                assert r.status_code == 200
            if rows[-1].get("finished"):
                break
    finally:
        watchdog.cancel()
        proc.terminate()
        proc.wait(timeout=30)
    assert any(r.get("event") == "startup" and "graft serve:" in r["message"] for r in rows)
    assert any(r["logger"] == "uvicorn.access" for r in rows)
    stats = rows[-1]
    assert stats["logger"] == stats_log.LOGGER and stats["finished"] == 1
    assert stats["generation_tokens_per_s"] > 0 and stats["running"] == 0


def test_token_counters_follow_the_stream(tiny_run_dir):
    """Prompt tokens count at the first token, generated tokens step by step, so the stats
    line's throughput over an interval shows a long answer while it is written."""
    from graft.serving import Engine, EngineConfig, SamplingParams
    from graft.serving.http.engine_worker import EngineWorker
    from graft.serving.http.job import Job
    from graft.serving.http.plumbing.metrics import ServerMetrics

    metrics = ServerMetrics({})
    worker = EngineWorker(Engine.from_pretrained(tiny_run_dir, EngineConfig(num_kv_blocks=64)),
                          metrics)
    outs = []
    prompt = [5, 6, 7, 8, 9]
    job = Job("r", prompt, SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True),
              sink=lambda kind, out: outs.append(out))
    worker.submit(job, budget_s=None)
    seen = []
    while worker.pending or worker.engine.has_unfinished_requests():
        worker._run_once([])
        if outs:
            seen.append((len(outs[-1].token_ids), metrics.generation_tokens.value,
                         metrics.prompt_tokens.value, metrics.finished.value))
    assert [s[1] for s in seen] == [s[0] for s in seen]  # every delivered token, at once
    assert all(p == len(prompt) for _, _, p, _ in seen)
    assert [f for *_, f in seen][:-1] == [0] * (len(seen) - 1) and seen[-1][3] == 1
    assert seen[-1][0] == 6 and len(seen) > 2  # counted over several steps, not at the end
