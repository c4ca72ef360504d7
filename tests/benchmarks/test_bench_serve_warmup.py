"""`graft bench serve --warmup N`: N short requests reach the server before the measured load
and stay out of the report."""

import json

from graft.benchmarks import serve
from graft.tune.trace import read_trace
from tests.benchmarks.test_bench_serve_trace import _args, _server
from tests.serving.http.conftest import LiveServer


def test_warmup_requests_are_sent_first_and_left_out(tiny_run_dir, tmp_path):
    recorded, out = tmp_path / "recorded.jsonl", tmp_path / "report.json"
    app = _server(tiny_run_dir, recorded)
    with LiveServer(app) as live:
        assert serve.run(_args(live.url, "--warmup", "3", "--num-requests", "4", "--concurrency",
                               "2", "--image-ratio", "0", "--cache-probe", "0", "--max-tokens",
                               "3", "--out", str(out))) == 0
    app.state.ctx.worker.tracer.close()
    report = json.loads(out.read_text())
    assert report["completed"] == report["requests"] == 4, report["sample_errors"]
    seen = sorted(read_trace(recorded), key=lambda r: r.arrival)
    assert [r.output_tokens for r in seen] == [2, 2, 2, 3, 3, 3, 3]  # the warm-up came first
