"""Server metrics in the Prometheus text exposition format (no client library needed)."""

from __future__ import annotations

import bisect
import threading
from typing import Callable

# Seconds: from a few ms (cache hit, tiny model) to a minute (queued long prefill on CPU).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def _fmt(v: float) -> str:
    return repr(float(v)) if v != float("inf") else "+Inf"


def _labels(labels: dict[str, str], **more: str) -> str:
    items = {**labels, **more}
    if not items:
        return ""
    esc = {k: str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
           for k, v in items.items()}
    return "{" + ",".join(f'{k}="{v}"' for k, v in esc.items()) + "}"


def _header(m, kind: str, header: bool) -> list[str]:
    return [f"# HELP {m.name} {m.help}", f"# TYPE {m.name} {kind}"] if header else []


class Counter:
    def __init__(self, name: str, help: str, labels: dict[str, str] | None = None):
        self.name, self.help, self.value = name, help, 0.0
        self.labels = labels or {}
        self.mirrors: list[Counter] = []  # counted too (the same event under another name)
        self._lock = threading.Lock()

    def inc(self, n: float = 1.0) -> None:
        with self._lock:
            self.value += n
        for m in self.mirrors:
            m.inc(n)

    def render(self, header: bool = True) -> list[str]:
        return _header(self, "counter", header) + [
            f"{self.name}{_labels(self.labels)} {_fmt(self.value)}"]


class Gauge:
    """Read on scrape from a callable, so it can never go stale."""
    kind = "gauge"

    def __init__(self, name: str, help: str, read: Callable[[], float],
                 labels: dict[str, str] | None = None):
        self.name, self.help, self.read = name, help, read
        self.labels = labels or {}

    def render(self, header: bool = True) -> list[str]:
        return _header(self, self.kind, header) + [
            f"{self.name}{_labels(self.labels)} {_fmt(self.read())}"]


class Histogram:
    def __init__(self, name: str, help: str, buckets: tuple[float, ...] = LATENCY_BUCKETS,
                 labels: dict[str, str] | None = None):
        self.name, self.help, self.buckets = name, help, tuple(sorted(buckets))
        self.labels = labels or {}
        self.counts = [0] * (len(self.buckets) + 1)  # last slot: above every bound (+Inf)
        self.sum = 0.0
        self.count = 0
        self.mirrors: list[Histogram] = []  # observed too (their own buckets)
        self._lock = threading.Lock()

    def observe(self, v: float) -> None:
        with self._lock:
            self.counts[bisect.bisect_left(self.buckets, v)] += 1
            self.sum += v
            self.count += 1
        for m in self.mirrors:
            m.observe(v)

    def render(self, header: bool = True) -> list[str]:
        lines = _header(self, "histogram", header)
        running = 0
        for bound, n in zip(self.buckets + (float("inf"),), self.counts):
            running += n
            lines.append(f"{self.name}_bucket{_labels(self.labels, le=_fmt(bound))} {running}")
        tail = _labels(self.labels)
        lines += [f"{self.name}_sum{tail} {_fmt(self.sum)}", f"{self.name}_count{tail} {self.count}"]
        return lines


class GraftMetrics:
    """One served model's series, labelled graft="NAME": requests, TTFT, encoder-cache use."""

    def __init__(self, name: str, cache_counts: Callable[[], tuple[int, int]] | None = None):
        lab = {"graft": name}
        self.requests = Counter("graft_per_graft_requests_total",
                                "Chat completion requests per graft.", lab)
        self.ttft = Histogram("graft_per_graft_time_to_first_token_seconds",
                              "Time to first token per graft.", labels=lab)
        self.gauges = [] if cache_counts is None else [
            Gauge("graft_per_graft_encoder_cache_hits", "Encoder cache hits per graft.",
                  lambda: cache_counts()[0], lab),
            Gauge("graft_per_graft_encoder_cache_misses", "Encoder cache misses per graft.",
                  lambda: cache_counts()[1], lab),
            Gauge("graft_per_graft_encoder_cache_hit_rate",
                  "Encoder cache hits / lookups per graft.",
                  lambda: _rate(*cache_counts()), lab)]

    def series(self) -> list:
        return [self.requests, self.ttft, *self.gauges]


def render_families(series: list) -> list[str]:
    """Exposition lines of `series`, one HELP/TYPE per metric name: series sharing a name
    (other label values) follow their first."""
    by_name: dict[str, list] = {}
    for m in series:
        by_name.setdefault(m.name, []).append(m)
    return [line for group in by_name.values()
            for k, m in enumerate(group) for line in m.render(header=k == 0)]


def _rate(hits: int, misses: int) -> float:
    return hits / (hits + misses) if hits + misses else 0.0


class ServerMetrics:
    """Every metric /metrics shows; gauges read live state through callables."""

    def __init__(self, gauges: dict[str, tuple[str, Callable[[], float]]]):
        self.ttft = Histogram("graft_time_to_first_token_seconds", "Time to first token.")
        self.tpot = Histogram("graft_time_per_output_token_seconds",
                              "Mean time per output token after the first, per request.")
        self.e2e = Histogram("graft_e2e_request_latency_seconds", "End-to-end request latency.")
        # calibration of admission control: measured TTFT / estimated TTFT (1 = exact)
        self.ttft_vs_estimate = Histogram("graft_ttft_over_estimate_ratio",
                                          "Measured TTFT divided by the admission estimate.",
                                          buckets=(0.25, 0.5, 0.8, 1.0, 1.25, 1.5, 2.0, 4.0))
        self.requests = Counter("graft_requests_total", "Chat completion requests received.")
        self.finished = Counter("graft_requests_finished_total", "Requests that completed.")
        self.rejected_429 = Counter("graft_requests_rejected_429_total",
                                    "Requests refused by admission control (HTTP 429).")
        self.errors_4xx = Counter("graft_requests_4xx_total", "Requests answered with a 4xx.")
        self.aborted = Counter("graft_requests_aborted_total",
                               "Requests aborted: client gone, or --request-timeout-s.")
        self.timed_out = Counter("graft_requests_timed_out_total",
                                 "Requests stopped at --request-timeout-s (408).")
        self.deadline = Counter("graft_requests_deadline_total",
                                "Requests stopped at their deadline.")
        self.prompt_tokens = Counter("graft_prompt_tokens_total", "Prompt tokens processed.")
        self.generation_tokens = Counter("graft_generation_tokens_total", "Tokens generated.")
        self.encoder_peer_fetches = Counter(
            "graft_encoder_cache_peer_fetches_total",
            "Image embeddings taken from another worker's encoder cache instead of encoded.")
        self.gauges = [Gauge(name, help, read) for name, (help, read) in gauges.items()]
        self.grafts: dict[str, GraftMetrics] = {}  # served model name -> its labelled series
        self.vllm = None  # vllm_metrics.VllmMetrics once add_vllm ran
        self.families: list = []  # more series, labelled ones sharing a name (render_families)

    def add_graft(self, name: str, cache_counts: Callable[[], tuple[int, int]] | None = None
                  ) -> GraftMetrics:
        self.grafts[name] = GraftMetrics(name, cache_counts)
        return self.grafts[name]

    def add_vllm(self, vllm) -> None:
        """Feed `vllm` (a vllm_metrics.VllmMetrics) from the events counted here, and show it."""
        self.vllm = vllm
        self.ttft.mirrors.append(vllm.ttft)
        self.e2e.mirrors.append(vllm.e2e)
        self.prompt_tokens.mirrors.append(vllm.prompt_tokens)
        self.generation_tokens.mirrors.append(vllm.generation_tokens)

    def token_gap(self, seconds: float) -> None:
        """A request's next output came `seconds` after its previous one."""
        if self.vllm is not None:
            self.vllm.token_gap(seconds)

    def request_finished(self, reason: str | None) -> None:
        self.finished.inc()
        if self.vllm is not None:
            self.vllm.finished(reason)

    def render(self) -> str:
        lines: list[str] = []
        for m in (self.ttft, self.tpot, self.e2e, self.ttft_vs_estimate, self.requests, self.finished,
                  self.rejected_429, self.errors_4xx, self.aborted, self.timed_out,
                  self.deadline, self.prompt_tokens, self.generation_tokens,
                  self.encoder_peer_fetches, *self.gauges):
            lines += m.render()
        # one HELP/TYPE per family, then a sample set per graft
        lines += render_families([m for g in self.grafts.values() for m in g.series()])
        lines += render_families(self.families)
        if self.vllm is not None:
            lines += self.vllm.render()
        return "\n".join(lines) + "\n"


def speculation_gauges(engine) -> dict[str, tuple[str, Callable[[], float]]]:
    """Speculative decoding series, read from the engine's counters (zero while it is off)."""
    spec = engine.spec  # plain int reads: safe beside the engine thread

    def rate() -> float:
        return spec.accepted / spec.proposed if spec.proposed else 0.0

    def length() -> float:
        return (spec.accepted + spec.steps) / spec.steps if spec.steps else 0.0

    return {
        "graft_spec_decode_proposed_tokens": ("Speculative tokens proposed.", lambda: spec.proposed),
        "graft_spec_decode_accepted_tokens": ("Speculative tokens accepted.", lambda: spec.accepted),
        "graft_spec_decode_verify_steps": ("Sequence steps that verified proposals.",
                                           lambda: spec.steps),
        "graft_spec_decode_acceptance_rate": ("Accepted / proposed speculative tokens.", rate),
        "graft_spec_decode_mean_accepted_length": (
            "Tokens emitted per verify step (accepted proposals + the step's own token).", length),
    }
