"""Encoder cache (LRU, pins, byte budget, counters), admission control and /metrics text."""

import pytest
import torch

from graft.serving.http.plumbing.admission import AdmissionController, QueueItem, StepCostModel
from graft.serving.multimodal.encoder_cache import EncoderCache, cache_key
from graft.serving.http.plumbing.metrics import Histogram, ServerMetrics
from graft.serving.http.openai.openai_chat import APIError


def _rows(n):  # n rows of 4 float32 = 16 n bytes
    return torch.full((n, 4), float(n))


def test_key_covers_every_part():
    base = cache_key("pix", "pre", "enc", "ada")
    others = [cache_key("pix2", "pre", "enc", "ada"), cache_key("pix", "pre2", "enc", "ada"),
              cache_key("pix", "pre", "enc2", "ada"), cache_key("pix", "pre", "enc", "ada2"),
              cache_key("pi", "xpre", "enc", "ada")]
    assert len({base, *others}) == 6


def test_lru_evicts_only_unpinned_and_bytes_stay_bounded():
    cache = EncoderCache(max_bytes=16 * 10)
    assert cache.put("a", _rows(4), owner="r1")  # pinned
    assert cache.put("b", _rows(4))
    assert cache.get("b") is not None and cache.get("zz") is None
    assert (cache.hits, cache.misses) == (1, 1)
    # 4 + 4 + 4 > 10 rows: "b" (unpinned) goes, "a" (pinned) stays
    assert cache.put("c", _rows(4))
    assert "a" in cache and "b" not in cache and cache.evictions == 1
    assert cache.bytes == 16 * 8 <= cache.max_bytes
    # no room while both remaining are pinned
    cache.get("c", owner="r2")
    assert not cache.can_fit(16 * 4) and not cache.put("d", _rows(4))
    assert not cache.put("huge", _rows(11))  # larger than the whole cache
    cache.release("r1")
    cache.release("r2")
    assert cache.pinned_bytes == 0 and cache.put("d", _rows(4))
    cache.clear()
    assert cache.bytes == 0 and len(cache) == 0


def test_lru_order_follows_use():
    cache = EncoderCache(max_bytes=16 * 8)
    cache.put("old", _rows(4))
    cache.put("new", _rows(4))
    cache.get("old")  # now most recent
    cache.put("third", _rows(4))
    assert "old" in cache and "new" not in cache


def test_pins_are_per_owner():
    cache = EncoderCache(max_bytes=16 * 8)
    cache.put("a", _rows(4), owner="r1")
    cache.put("a", _rows(4), owner="r2")  # same key: pins, no second copy
    assert cache.bytes == 64
    cache.release("r1")
    assert cache.pinned_bytes == 64
    cache.release("r2")
    assert cache.pinned_bytes == 0
    with pytest.raises(ValueError):
        EncoderCache(0)


def test_cost_model_learns_step_costs():
    cost = StepCostModel()
    for p, d in [(0, 4), (64, 2), (128, 0), (256, 1), (0, 8), (32, 3)] * 5:
        cost.observe_step(p, d, 0.002 + 1e-4 * p + 1e-3 * d)
    c0, c1, c2 = cost.coefficients
    assert c0 == pytest.approx(0.002, rel=0.05) and c1 == pytest.approx(1e-4, rel=0.05)
    assert c2 == pytest.approx(1e-3, rel=0.05)
    cost.observe_encode(100, 0.5)
    assert cost.encode_s_per_token == pytest.approx(0.005)


def _controller(seconds_per_token: float) -> AdmissionController:
    cost = StepCostModel()
    for p in (0, 100, 200, 300):
        cost.observe_step(p, 0, 0.001 + seconds_per_token * p)
    return AdmissionController(cost, token_budget=512)


def test_admission_refuses_with_retry_after_and_respects_edf():
    ctl = _controller(0.01)  # 10 ms per prompt token
    mine = QueueItem(deadline=10.0, prefill_tokens=10, encode_tokens=0)
    assert ctl.admit(mine, budget_s=1.0, queue=[], decode_seqs=0) < 1.0
    later = [QueueItem(deadline=99.0, prefill_tokens=1000, encode_tokens=0)]
    assert ctl.admit(mine, budget_s=1.0, queue=later, decode_seqs=0) < 1.0  # EDF: not ahead
    earlier = [QueueItem(deadline=5.0, prefill_tokens=1000, encode_tokens=0)]
    with pytest.raises(APIError) as info:
        ctl.admit(mine, budget_s=1.0, queue=earlier, decode_seqs=0)
    err = info.value
    assert err.status == 429 and int(err.headers["Retry-After"]) >= 1
    assert err.body()["error"]["code"] == "ttft_budget_exceeded" and ctl.rejected == 1
    # no budget: always admitted, still estimated
    assert ctl.admit(mine, budget_s=None, queue=earlier, decode_seqs=0) > 1.0


def test_measured_overruns_make_admission_stricter():
    ctl = _controller(0.001)  # 1 ms per prompt token
    item = QueueItem(deadline=1.0, prefill_tokens=300, encode_tokens=0)
    raw = ctl.admit(item, budget_s=0.5, queue=[], decode_seqs=0)  # ~0.3 s: fits
    for _ in range(10):  # the machine turned out 3x slower than the model said
        ctl.observe_ttft(3 * raw, raw)
    assert ctl.correction == pytest.approx(3.0)
    with pytest.raises(APIError):
        ctl.admit(item, budget_s=0.5, queue=[], decode_seqs=0)


def test_prometheus_text():
    h = Histogram("x_seconds", "help", buckets=(0.1, 1.0))
    for v in (0.05, 0.5, 5.0):
        h.observe(v)
    lines = h.render()
    assert 'x_seconds_bucket{le="0.1"} 1' in lines and 'x_seconds_bucket{le="+Inf"} 3' in lines
    assert "x_seconds_count 3" in lines
    m = ServerMetrics({"graft_queue_depth": ("q", lambda: 3)})
    m.rejected_429.inc()
    text = m.render()
    assert "graft_requests_rejected_429_total 1.0" in text and "graft_queue_depth 3.0" in text
    assert "# TYPE graft_time_to_first_token_seconds histogram" in text
