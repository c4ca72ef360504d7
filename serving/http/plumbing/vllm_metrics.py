"""vLLM's Prometheus series beside graft's own: the names, types, buckets and labels
(model_name, engine) that vllm/v1/metrics/loggers.py exports, for the routers, autoscalers
and dashboards built on them. They read the same events and state as the graft_* series:
ServerMetrics forwards its observations here (ServerMetrics.add_vllm)."""

from __future__ import annotations

from typing import Callable

from graft.serving.http.plumbing.metrics import Counter, Gauge, Histogram, render_families

# vLLM's buckets, copied from its loggers
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)

# vLLM's FinishReason values; graft's own reasons map onto them
FINISH_REASONS = ("stop", "length", "abort", "error")
_REASON = {"deadline": "abort", "internal_error": "error"}


class ReadCounter(Gauge):
    """A counter whose value the engine keeps (read on scrape, like a Gauge)."""
    kind = "counter"


class VllmMetrics:
    """One engine's vllm:* series. `load` reads fleet.server_info.load (running, waiting,
    kv_usage); `prefix` reads (queried tokens, hit tokens) of the engine's prefix cache."""

    def __init__(self, model_name: str, load: Callable, prefix: Callable[[], tuple[int, int]]):
        lab = {"model_name": model_name, "engine": "0"}
        self.ttft = Histogram("vllm:time_to_first_token_seconds",
                              "Histogram of time to first token in seconds.", TTFT_BUCKETS, lab)
        self.itl = Histogram("vllm:inter_token_latency_seconds",
                             "Histogram of inter-token latency in seconds.", ITL_BUCKETS, lab)
        # vLLM's older name for the same observations (deprecated there, still scraped)
        self.tpot = Histogram("vllm:time_per_output_token_seconds",
                              "Histogram of time per output token in seconds.", ITL_BUCKETS, lab)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds",
                             "Histogram of e2e request latency in seconds.", E2E_BUCKETS, lab)
        self.prompt_tokens = Counter("vllm:prompt_tokens_total",
                                     "Number of prefill tokens processed.", lab)
        self.generation_tokens = Counter("vllm:generation_tokens_total",
                                         "Number of generation tokens processed.", lab)
        self.success = {reason: Counter("vllm:request_success_total",
                                        "Count of successfully processed requests.",
                                        {**lab, "finished_reason": reason})
                        for reason in FINISH_REASONS}
        self.state = [
            Gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                  lambda: load().running, lab),
            Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                  lambda: load().waiting, lab),
            Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                  lambda: load().kv_usage, lab),
            ReadCounter("vllm:prefix_cache_queries_total",
                        "Prefix cache queries, in terms of number of queried tokens.",
                        lambda: prefix()[0], lab),
            ReadCounter("vllm:prefix_cache_hits_total",
                        "Prefix cache hits, in terms of number of cached tokens.",
                        lambda: prefix()[1], lab)]

    def token_gap(self, seconds: float) -> None:
        """The time between a request's two consecutive outputs (one per engine step, as
        vLLM observes it: a speculative step that emits several tokens is one gap)."""
        self.itl.observe(seconds)
        self.tpot.observe(seconds)

    def finished(self, reason: str | None) -> None:
        name = _REASON.get(reason, reason)
        self.success[name if name in self.success else "error"].inc()

    def render(self) -> list[str]:
        return render_families([*self.state, self.prompt_tokens, self.generation_tokens,
                                *self.success.values(), self.ttft, self.itl, self.tpot,
                                self.e2e])
