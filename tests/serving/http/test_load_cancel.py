"""A bounded load test: concurrent streaming and non-streaming requests with images (some
repeated), a third of them abandoned by their clients at different moments. Afterwards no
KV block is referenced, no encoder-cache entry is pinned, every request is counted finished
or aborted, and the server answers as before."""

import random
import threading
import time

import httpx
from PIL import Image

from graft.serving.multimodal.media import to_data_url

URL = "/v1/chat/completions"
IMAGES = [to_data_url(Image.new("RGB", (32, 32), c)) for c in
          ((200, 30, 30), (30, 200, 30), (30, 30, 200))]
N_CLIENTS = 24


def _body(rng, stream):
    text = {"type": "text", "text": rng.choice(["What color?", "Describe it.", "Which shape?"])}
    content = [text]
    if rng.random() < 0.75:
        content.insert(0, {"type": "image_url", "image_url": {"url": rng.choice(IMAGES)}})
    return {"model": "tiny", "messages": [{"role": "user", "content": content}],
            "max_tokens": rng.randint(4, 40), "ignore_eos": True, "temperature": 0,
            "stream": stream}


def _client(server, seed, errors):
    rng = random.Random(seed)
    kind = seed % 4  # 0: stream to the end, 1: stream then hang up, 2: give up early, 3: wait
    try:
        if kind in (0, 1):
            with httpx.stream("POST", server.url + URL, json=_body(rng, True),
                              timeout=60) as resp:
                assert resp.status_code == 200
                for n, line in enumerate(resp.iter_lines()):
                    if kind == 1 and n >= rng.randint(0, 6):
                        break
        else:
            try:
                resp = httpx.post(server.url + URL, json=_body(rng, False),
                                  timeout=rng.uniform(0.05, 0.4) if kind == 2 else 60)
                assert resp.status_code == 200, resp.text
            except httpx.TimeoutException:
                assert kind == 2
    except Exception as err:  # noqa: BLE001 - reported by the test thread
        errors.append(repr(err))


def _wait_idle(ctx, timeout_s=60.0):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and (ctx.worker.active or ctx.worker.pending
                                      or ctx.engine.has_unfinished_requests()):
        time.sleep(0.05)
    assert not ctx.worker.active and not ctx.worker.pending


def test_load_with_cancellations_leaves_nothing_behind(live_server):
    ctx = live_server.app.state.ctx
    bm = ctx.engine.block_manager
    probe = {"model": "tiny", "max_tokens": 6, "temperature": 0, "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": IMAGES[0]}},
                                     {"type": "text", "text": "What color?"}]}]}
    before = httpx.post(live_server.url + URL, json=probe, timeout=60).json()
    _wait_idle(ctx)
    finished0, aborted0 = ctx.metrics.finished.value, ctx.metrics.aborted.value
    errors: list[str] = []
    threads = [threading.Thread(target=_client, args=(live_server, seed, errors))
               for seed in range(N_CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    _wait_idle(ctx)
    assert sum(1 for r in bm.ref_counts if r > 0) == 0  # no KV block held by a request
    assert ctx.front.cache.pinned_bytes == 0
    done = (ctx.metrics.finished.value - finished0) + (ctx.metrics.aborted.value - aborted0)
    assert done == N_CLIENTS
    assert ctx.metrics.aborted.value > aborted0
    after = httpx.post(live_server.url + URL, json=probe, timeout=60).json()
    assert after["choices"][0]["message"] == before["choices"][0]["message"]
