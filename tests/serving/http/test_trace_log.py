"""`graft serve --trace FILE`: one line per finished request with the trace format's fields
(read back by graft tune's reader), no text or pixels unless --trace-content, rotated by size."""

import argparse
import json

import httpx
from PIL import Image

from graft.digests import pixel_hash
from graft.serving.multimodal.media import to_data_url
from graft.tune.trace import read_trace
from tests.serving.http.conftest import LiveServer


def _server(run_dir, trace, *extra):
    from graft.serving.http import serve_cli

    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    args = parser.parse_args([str(run_dir), "--served-model-name", "tiny", "--trace", str(trace),
                              "--max-model-len", "256", "--num-kv-blocks", "64", *extra])
    return serve_cli.build(args)


def _chat(server, image, text, stream):
    body = {"model": "tiny", "max_tokens": 3, "temperature": 0, "ignore_eos": True,
            "stream": stream, "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": to_data_url(image)}},
                {"type": "text", "text": text}]}]}
    if stream:
        body["stream_options"] = {"include_usage": True}
    resp = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    assert resp.status_code == 200
    if not stream:
        return resp.json()["usage"]
    chunks = [json.loads(line[6:]) for line in resp.text.splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    return next(c["usage"] for c in chunks if c.get("usage"))


def test_trace_records_each_request_without_content(tiny_run_dir, tmp_path):
    trace = tmp_path / "trace.jsonl"
    image = Image.new("RGB", (32, 32), (10, 200, 30))
    app = _server(tiny_run_dir, trace)
    with LiveServer(app) as server:
        first = _chat(server, image, "secret words", stream=True)
        second = _chat(server, image, "secret words", stream=False)  # same image: cached
    app.state.ctx.worker.tracer.close()
    text = trace.read_text()
    assert "secret" not in text and "base64" not in text  # no text, no pixels
    a, b = read_trace(trace)  # the tune reader accepts what the server wrote
    assert (a.prompt_tokens, a.output_tokens) == (first["prompt_tokens"], 3)
    assert (b.prompt_tokens, b.output_tokens) == (second["prompt_tokens"], 3)
    assert (a.stream, b.stream) == (True, False)
    assert a.status == b.status == "ok" and a.finish_reason == "length"
    assert a.max_tokens == 3 and a.temperature == 0.0 and a.model == "tiny"
    (im,) = a.images
    assert (im.width, im.height, im.sha256) == (32, 32, pixel_hash(image)) and im.tokens > 0
    assert a.encoder_cache_hit_tokens == 0 and b.encoder_cache_hit_tokens == im.tokens
    assert b.prefix_cache_hit_tokens > 0  # the same prompt again: its full blocks are cached
    for r in (a, b):
        assert 0 < r.ttft_ms <= r.e2e_ms and r.tpot_ms is not None and r.messages is None
    assert a.arrival <= b.arrival


def test_trace_content_and_rotation(tiny_run_dir, tmp_path):
    trace = tmp_path / "trace.jsonl"
    app = _server(tiny_run_dir, trace, "--trace-content", "--trace-max-bytes", "300")
    colors = [(200, 0, 0), (0, 200, 0), (0, 0, 200)]
    with LiveServer(app) as server:
        for color in colors:
            _chat(server, Image.new("RGB", (32, 32), color), "what color?", stream=False)
    app.state.ctx.worker.tracer.close()
    # every line is over 300 bytes (it holds the image): each write rotated the older ones
    files = [trace.with_name("trace.jsonl.2"), trace.with_name("trace.jsonl.1"), trace]
    records = [r for f in files for r in read_trace(f)]
    assert not trace.with_name("trace.jsonl.3").exists()
    assert len(records) == 3
    for record, color in zip(records, colors):
        parts = record.messages[0]["content"]
        assert parts[1] == {"type": "text", "text": "what color?"}
        assert parts[0]["image_url"]["url"] == to_data_url(Image.new("RGB", (32, 32), color))
        assert record.images[0].sha256 == pixel_hash(Image.new("RGB", (32, 32), color))


def test_a_completions_request_is_traced_without_messages(tiny_run_dir, tmp_path):
    """/v1/completions has a prompt, not a chat: its line has the counts and timings, and even
    with --trace-content no messages (graft tune replays a stand-in of its length)."""
    trace = tmp_path / "trace.jsonl"
    app = _server(tiny_run_dir, trace, "--trace-content")
    with LiveServer(app) as server:
        resp = httpx.post(server.url + "/v1/completions", timeout=120, json={
            "model": "tiny", "prompt": "once upon a time", "max_tokens": 2, "temperature": 0})
        assert resp.status_code == 200
    app.state.ctx.worker.tracer.close()
    (record,) = read_trace(trace)
    assert record.status == "ok" and record.output_tokens == 2 and record.messages is None
    assert record.prompt_tokens == resp.json()["usage"]["prompt_tokens"] and record.max_tokens == 2


def test_an_unwritable_trace_path_fails_before_the_model_loads(tmp_path, capsys):
    """A folder given as FILE was an error naming no flag, after the model had loaded."""
    from graft.cli import main
    from tests.serving.http.conftest import _free_port

    # the PATH is checked only when the model loads: its error would mean the trace was not
    assert main(["serve", str(tmp_path / "no-model"), "--port", str(_free_port()),
                 "--trace", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"--trace: output {tmp_path} is a directory; give a file path" in err
