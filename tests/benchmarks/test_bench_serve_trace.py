"""`graft bench serve URL --trace TRACE`: a trace's requests reach a real server as recorded
(content or stand-ins of the recorded shape, each forced to its recorded output length), so a
trace recorded by one `graft serve --trace` can be sent again to another server."""

import argparse
import json

import pytest

from graft.benchmarks import serve
from graft.benchmarks.serve_trace import trace_workload
from graft.errors import GraftConfigError
from graft.tune.synth import synth_trace
from graft.tune.trace import make_record, read_trace, write_trace
from tests.serving.http.conftest import LiveServer


def _args(*argv):
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    return parser.parse_args(list(argv))


def _server(run_dir, trace):
    from graft.serving.http import serve_cli

    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    return serve_cli.build(parser.parse_args([
        str(run_dir), "--served-model-name", "tiny", "--trace", str(trace), "--trace-content",
        "--max-model-len", "256", "--num-kv-blocks", "64", "--max-num-batched-tokens", "64"]))


def test_a_trace_sent_to_a_server_is_recorded_again_with_the_same_work(tiny_run_dir, tmp_path):
    sent = tmp_path / "sent.jsonl"
    records = synth_trace("image-burst", n=5, seed=3, rate=50.0, image_size=32)
    for r in records:
        r["output_tokens"] = r["max_tokens"] = 3  # keep the tiny model's work short
    shaped = make_record(arrival=records[-1]["arrival"] + 0.01, prompt_tokens=30,
                         output_tokens=4, images=records[0]["images"], temperature=0.0)
    write_trace(sent, records + [shaped])  # the last one has no content: stand-ins go out
    recorded = tmp_path / "recorded.jsonl"
    app = _server(tiny_run_dir, recorded)
    out = tmp_path / "report.json"
    with LiveServer(app) as live:
        assert serve.run(_args(live.url, "--trace", str(sent), "--out", str(out))) == 0
    app.state.ctx.worker.tracer.close()
    report = json.loads(out.read_text())
    assert report["completed"] == report["requests"] == 6, report["sample_errors"]
    again = sorted(read_trace(recorded), key=lambda r: r.arrival)
    assert sorted(r.output_tokens for r in again) == [3, 3, 3, 3, 3, 4]
    assert all(r.status == "ok" and r.finish_reason == "length" for r in again)
    # the stand-in image is the same picture for the same sha256: the server hashes it so
    shas = {im.sha256 for r in again for im in r.images}
    assert {im["sha256"] for im in records[0]["images"]} <= shas
    # content records went out as recorded (the server wrote what it was sent)
    sent_texts = {json.dumps(r["messages"], sort_keys=True) for r in records}
    got_texts = {json.dumps(r.messages, sort_keys=True) for r in again}
    assert sent_texts <= got_texts


def test_arrival_gaps_are_kept_and_divided_by_speed():
    recs = [make_record(arrival=100.0 + t, prompt_tokens=20, output_tokens=5)
            for t in (0.0, 0.5, 2.0)]
    from graft.tune.trace import parse_record

    parsed = [parse_record(r, f"line {i}") for i, r in enumerate(recs)]
    plan = trace_workload(parsed, "m", speed=2.0)
    assert [due for due, _, _ in plan] == [0.0, 0.25, 1.0]
    body = plan[0][1]
    assert body["max_tokens"] == 5 and body["ignore_eos"] and body["stream"]
    words = body["messages"][0]["content"][-1]["text"].split()
    assert 5 <= len(words) <= 20  # ~ (20 prompt tokens - 8 template tokens) / 1.3
    with pytest.raises(GraftConfigError, match="--speed"):
        trace_workload(parsed, "m", speed=0.0)


def test_a_bad_trace_line_fails_before_any_request(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(make_record(arrival=1.0, prompt_tokens=3, output_tokens=2)) + "\n"
                   + '{"v": 1, "arrival": 2.0, "prompt_tokens": "many", "output_tokens": 2}\n')
    # the URL is never contacted: the trace is read first
    with pytest.raises(GraftConfigError, match="line 2.*prompt_tokens"):
        serve.run(_args("http://127.0.0.1:9", "--trace", str(bad)))
