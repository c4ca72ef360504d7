"""The chat API over real HTTP: the official openai client, SSE, bad input, 429s,
deadlines, cancellation, /metrics; the server keeps serving after every failure."""

import base64
import time

import httpx
import numpy as np
import pytest
from PIL import Image

from graft.serving.multimodal.media import to_data_url

RED = Image.new("RGB", (32, 32), (220, 20, 20))
BLUE = Image.new("RGB", (32, 32), (20, 20, 220))
NOISE = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 40, 3), dtype=np.uint8))


def _msgs(image=RED, text="What color?"):
    content = [{"type": "text", "text": text}]
    if image is not None:
        content.insert(0, {"type": "image_url", "image_url": {"url": to_data_url(image)}})
    return [{"role": "user", "content": content}]


def _post(server, body, **kw):
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60, **kw)


def _ctx(server):
    return server.app.state.ctx


def _wait_idle(server, timeout=30.0):
    ctx = _ctx(server)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not ctx.worker.active and not ctx.worker.pending and \
                not ctx.engine.has_unfinished_requests():
            return
        time.sleep(0.05)
    raise AssertionError("requests still in flight")


def test_openai_client_chat_and_stream(live_server):
    from openai import OpenAI

    client = OpenAI(base_url=live_server.url + "/v1", api_key="unused")
    assert [m.id for m in client.models.list().data] == ["tiny"]
    out = client.chat.completions.create(model="tiny", messages=_msgs(), max_tokens=5,
                                         temperature=0, seed=1)
    assert out.choices[0].finish_reason in ("stop", "length")
    assert out.usage.completion_tokens <= 5 and out.usage.prompt_tokens > 16
    chunks = list(client.chat.completions.create(
        model="tiny", messages=_msgs(), max_tokens=5, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == out.choices[0].message.content  # greedy: streaming == non-streaming
    assert chunks[-1].usage.completion_tokens == out.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == \
        out.choices[0].finish_reason
    # text-only request on the same multimodal model
    plain = client.chat.completions.create(model="tiny", messages=[
        {"role": "user", "content": "hello"}], max_tokens=3, temperature=0)
    assert plain.usage.prompt_tokens < out.usage.prompt_tokens


def test_logprobs_like_openai(live_server):
    from openai import OpenAI

    client = OpenAI(base_url=live_server.url + "/v1", api_key="unused")
    kw = dict(model="tiny", messages=_msgs(), max_tokens=6, temperature=0, logprobs=True,
              top_logprobs=3, extra_body={"ignore_eos": True})
    out = client.chat.completions.create(**kw)
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens == 6
    for tok in content:
        alts = [a.logprob for a in tok.top_logprobs]
        assert len(alts) == 3 and alts == sorted(alts, reverse=True) and alts[0] <= 0.0
        assert tok.logprob == alts[0]  # greedy picks the most likely token
        assert tok.token == tok.top_logprobs[0].token and tok.bytes == list(tok.token.encode())
    assert "".join(t.token for t in content) == out.choices[0].message.content
    streamed = [t for c in client.chat.completions.create(stream=True, **kw)
                if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [(t.token, round(t.logprob, 5)) for t in streamed] == \
        [(t.token, round(t.logprob, 5)) for t in content]
    plain = client.chat.completions.create(model="tiny", messages=_msgs(), max_tokens=2)
    assert plain.choices[0].logprobs is None  # off unless asked for


def test_local_media_path(live_server):
    RED.save(live_server.media_dir / "red.png")
    msgs = _msgs(image=None)
    msgs[0]["content"].insert(0, {"type": "image_url",
                                  "image_url": {"url": str(live_server.media_dir / "red.png")}})
    a = _post(live_server, {"model": "tiny", "messages": msgs, "max_tokens": 4, "temperature": 0})
    b = _post(live_server, {"model": "tiny", "messages": _msgs(), "max_tokens": 4,
                            "temperature": 0})
    assert a.status_code == 200
    assert a.json()["choices"][0]["message"] == b.json()["choices"][0]["message"]


def _img_part(url):
    return {"type": "image_url", "image_url": {"url": url}}


BAD = {
    "malformed_json": (b"{'model': ", 400, None),
    "wrong_type": ({"model": "tiny", "messages": "hi"}, 400, "messages"),
    "bad_temperature": ({"model": "tiny", "messages": _msgs(None), "temperature": -1}, 400,
                        "temperature"),
    "bad_base64": ({"model": "tiny", "messages": [{"role": "user", "content": [
        _img_part("data:image/png;base64,!!!")]}]}, 400, "messages[0].content[0].image_url.url"),
    "not_an_image": ({"model": "tiny", "messages": [{"role": "user", "content": [
        _img_part("data:image/png;base64," + base64.b64encode(b"plain text").decode())]}]},
        400, "messages[0].content[0].image_url.url"),
    "too_many_pixels": ({"model": "tiny", "messages": _msgs(Image.new("RGB", (128, 128)))},
                        413, "messages[0].content[0].image_url.url"),
    "too_many_bytes": ({"model": "tiny", "messages": _msgs(NOISE)}, 413,
                       "messages[0].content[0].image_url.url"),
    "too_many_images": ({"model": "tiny", "messages": [{"role": "user", "content": [
        _img_part(to_data_url(RED))] * 3}]}, 400, "messages"),
    "remote_url": ({"model": "tiny", "messages": [{"role": "user", "content": [
        _img_part("http://127.0.0.1:1/x.png")]}]}, 403, "messages[0].content[0].image_url.url"),
    "outside_media_root": ({"model": "tiny", "messages": [{"role": "user", "content": [
        _img_part("/etc/hostname")]}]}, 403, "messages[0].content[0].image_url.url"),
    "over_context": ({"model": "tiny", "messages": _msgs(None, "one two " * 200)}, 400,
                     "messages"),
    "max_tokens_over_context": ({"model": "tiny", "messages": _msgs(None), "max_tokens": 10_000},
                                400, "messages"),
    "unknown_model": ({"model": "gpt-9", "messages": _msgs(None)}, 404, "model"),
    "n_129": ({"model": "tiny", "messages": _msgs(None), "n": 129}, 400, "n"),
    "top_logprobs_21": ({"model": "tiny", "messages": _msgs(None), "logprobs": True,
                         "top_logprobs": 21}, 400, "top_logprobs"),
    "top_logprobs_without_logprobs": ({"model": "tiny", "messages": _msgs(None),
                                       "top_logprobs": 2}, 400, "top_logprobs"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_gets_openai_error_and_server_survives(live_server, case):
    body, status, param = BAD[case]
    if isinstance(body, bytes):
        resp = httpx.post(live_server.url + "/v1/chat/completions", content=body,
                          headers={"content-type": "application/json"}, timeout=60)
    else:
        resp = _post(live_server, body)
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param
    _wait_idle(live_server)


def test_unknown_route_is_openai_shaped(live_server):
    resp = httpx.get(live_server.url + "/v1/nothing-here")
    assert resp.status_code == 404 and "error" in resp.json()


def test_budget_refusal_is_429_with_retry_after(live_server):
    resp = _post(live_server, {"model": "tiny", "messages": _msgs(), "max_tokens": 2,
                               "ttft_budget_ms": 0.0001})
    assert resp.status_code == 429
    assert int(resp.headers["retry-after"]) >= 1
    assert resp.json()["error"]["code"] == "ttft_budget_exceeded"
    ok = _post(live_server, {"model": "tiny", "messages": _msgs(), "max_tokens": 2,
                             "ttft_budget_ms": 600_000})
    assert ok.status_code == 200


def test_deadline_finish_reason(live_server):
    ctx = _ctx(live_server)
    ctx.worker.admission.slack = 0.0  # admit anything, so the deadline itself must act
    try:
        resp = _post(live_server, {"model": "tiny", "messages": _msgs(BLUE, "late"),
                                   "max_tokens": 4, "ttft_budget_ms": 0.001})
    finally:
        ctx.worker.admission.slack = 1.0
    assert resp.status_code == 200
    assert resp.json()["choices"][0]["finish_reason"] == "deadline"
    _wait_idle(live_server)


def test_disconnect_frees_the_request(live_server):
    ctx = _ctx(live_server)
    used_before = ctx.kv_blocks()[0]
    body = {"model": "tiny", "messages": _msgs(), "max_tokens": 200, "ignore_eos": True,
            "temperature": 0, "stream": True}
    with httpx.stream("POST", live_server.url + "/v1/chat/completions", json=body,
                      timeout=60) as resp:
        for line in resp.iter_lines():
            if '"content":"' in line and '"content":""' not in line:
                break  # got a real token: hang up mid-generation
    _wait_idle(live_server)
    assert ctx.front.cache.pinned_bytes == 0
    # finished requests keep their full blocks in the prefix cache; none are held by a request
    assert ctx.kv_blocks()[0] <= used_before + 0  # nothing still held
    assert ctx.metrics.aborted.value >= 1


def test_health_and_metrics(live_server):
    assert httpx.get(live_server.url + "/health").json() == {"status": "ok"}
    assert httpx.get(live_server.url + "/ping").json() == {"status": "ok"}  # vLLM's, SageMaker's
    text = httpx.get(live_server.url + "/metrics").text
    for name in ("graft_time_to_first_token_seconds_bucket", "graft_time_per_output_token_seconds",
                 "graft_queue_depth", "graft_running_requests", "graft_kv_blocks_used",
                 "graft_encoder_cache_hit_rate", "graft_requests_rejected_429_total"):
        assert name in text
