"""A client that goes away aborts its request within an engine step, streaming or not, and
graft_requests_aborted_total counts it; a failing request leaves concurrent streams intact."""

import threading
import time

import httpx
import pytest

URL = "/v1/chat/completions"


def _body(**kw):
    return {"model": "tiny", "messages": [{"role": "user", "content": "Describe the scene."}],
            "max_tokens": 150, "ignore_eos": True, "temperature": 0, **kw}


@pytest.fixture
def slow_steps(live_server, monkeypatch):
    """Each engine step takes >= 20 ms and is counted, so a request lasts seconds."""
    engine = live_server.app.state.ctx.engine
    real, count = engine.step, [0]

    def step():
        time.sleep(0.02)
        count[0] += 1
        return real()

    monkeypatch.setattr(engine, "step", step)
    return count


def _wait_gone(ctx, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not ctx.worker.active and not ctx.worker.pending:
            return
        time.sleep(0.005)
    raise AssertionError("the request is still in the engine")


def _aborted_within_a_step(live_server, steps, hang_up):
    ctx = live_server.app.state.ctx
    aborted0, finished0 = ctx.metrics.aborted.value, ctx.metrics.finished.value
    hang_up()  # returns once the client has closed its connection mid-generation
    at_hangup = steps[0]
    _wait_gone(ctx)
    assert steps[0] - at_hangup <= 2  # the step running then, at most one more
    assert ctx.metrics.aborted.value == aborted0 + 1
    assert ctx.metrics.finished.value == finished0  # it never ran to its end
    assert ctx.front.cache.pinned_bytes == 0
    text = httpx.get(live_server.url + "/metrics").text
    assert f"graft_requests_aborted_total {aborted0 + 1:.1f}" in text


def test_non_streaming_disconnect_aborts(live_server, slow_steps):
    def hang_up():
        with pytest.raises(httpx.ReadTimeout):  # the client gives up while tokens flow
            httpx.post(live_server.url + URL, json=_body(), timeout=0.6)

    _aborted_within_a_step(live_server, slow_steps, hang_up)


def test_streaming_disconnect_aborts(live_server, slow_steps):
    def hang_up():
        with httpx.stream("POST", live_server.url + URL, json=_body(stream=True),
                          timeout=30) as resp:
            for line in resp.iter_lines():  # (a random model's text may come only at the end)
                if line.startswith("data: "):
                    break  # the first event: the request is in the engine now

    _aborted_within_a_step(live_server, slow_steps, hang_up)


def test_failing_request_leaves_concurrent_streams_intact(live_server, slow_steps,
                                                          monkeypatch):
    ctx = live_server.app.state.ctx
    alone = httpx.post(live_server.url + URL, json=_body(max_tokens=12), timeout=60).json()
    real = ctx.engine.sampler

    def sampler(logits, seqs):  # request with seed 4242 breaks the sampler
        if any(s.params.seed == 4242 for s in seqs):
            raise RuntimeError("injected")
        return real(logits, seqs)

    monkeypatch.setattr(ctx.engine, "sampler", sampler)
    texts = []

    def streamer():
        with httpx.stream("POST", live_server.url + URL, json=_body(max_tokens=12, stream=True),
                          timeout=60) as resp:
            texts.append("".join(line for line in resp.iter_lines()))

    threads = [threading.Thread(target=streamer) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.1)  # the streams are decoding when the bad request joins
    bad = httpx.post(live_server.url + URL, json=_body(seed=4242), timeout=60)
    for t in threads:
        t.join(timeout=60)
    assert bad.status_code == 500 and bad.json()["error"]["code"] == "engine_error"
    assert "injected" not in bad.text
    want = alone["choices"][0]["message"]["content"]
    assert len(texts) == 3
    for text in texts:
        assert '"error"' not in text and text.endswith("data: [DONE]")
        got = "".join(__import__("json").loads(part)["choices"][0]["delta"].get("content") or ""
                      for part in text.split("data: ")[1:-1] if '"choices":[{' in part)
        assert got == want
