"""Latency budgets: estimate a new request's TTFT from queue state and measured costs,
and refuse (HTTP 429 + Retry-After) what cannot meet its budget.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from graft.serving.engine.step_cost import StepCostModel
from graft.serving.http.openai.openai_chat import APIError

__all__ = ["AdmissionController", "QueueItem", "QueueLimits", "StepCostModel"]


@dataclass
class QueueItem:
    deadline: float  # absolute monotonic seconds; inf when the request has no budget
    prefill_tokens: int  # prompt tokens not yet prefilled
    encode_tokens: int  # image tokens not yet encoded (cache misses only)


class AdmissionController:
    """Admit a request when its estimated TTFT (work queued ahead of it under EDF + its own
    encode + prefill) fits its budget; otherwise raise a 429 with a Retry-After."""

    def __init__(self, cost: StepCostModel, token_budget: int, slack: float = 1.0,
                 quantile: float = 0.9, prefill_tokens: int | None = None):
        self.cost = cost
        self.token_budget = token_budget
        self.prefill_tokens = prefill_tokens  # EngineConfig.max_prefill_tokens (None: the budget)
        self.slack = slack  # multiply estimates (>1: conservative)
        self.quantile = quantile  # of measured/estimated TTFT that scales decisions
        self._ratios: deque[float] = deque(maxlen=64)
        self.rejected = 0

    def observe_ttft(self, measured_s: float, estimate_s: float) -> None:
        """Feedback from an admitted request: its measured TTFT against the model's estimate."""
        if estimate_s > 0:
            self._ratios.append(measured_s / estimate_s)

    @property
    def correction(self) -> float:
        """A high quantile of measured/estimated TTFT over recent requests (never below 1):
        keeps decisions honest when the machine's speed drifts under the cost model."""
        if len(self._ratios) < 8:
            return 1.0
        return min(max(float(np.quantile(list(self._ratios), self.quantile)), 1.0), 8.0)

    def estimate_ttft(self, item: QueueItem, queue: list[QueueItem], decode_seqs: int) -> float:
        # Earliest-deadline-first: only work due no later than ours runs before ours.
        ahead = [q for q in queue if q.deadline <= item.deadline]
        prefill = item.prefill_tokens + sum(q.prefill_tokens for q in ahead)
        encode = item.encode_tokens + sum(q.encode_tokens for q in ahead)
        c0, _, c2 = self.cost.coefficients
        in_flight = c0 + c2 * decode_seqs  # the step running now must end before ours starts
        prefill_s = self.cost.prefill_seconds(prefill, decode_seqs, self.token_budget,
                                              self.prefill_tokens)
        return in_flight + prefill_s + encode * self.cost.encode_s_per_token

    def admit(self, item: QueueItem, budget_s: float | None, queue: list[QueueItem],
              decode_seqs: int) -> float:
        """The cost model's TTFT estimate in seconds (for `observe_ttft`), or APIError(429)
        when the estimate times slack and correction exceeds `budget_s`."""
        raw = self.estimate_ttft(item, queue, decode_seqs)
        estimate = raw * self.slack * self.correction
        if budget_s is not None and estimate > budget_s:
            self.rejected += 1
            # Work ahead drains at roughly the estimated rate: retry once it has.
            retry = max(1, math.ceil(estimate - budget_s))
            raise APIError(
                f"server cannot meet a {budget_s * 1000:.0f} ms time-to-first-token budget "
                f"now (estimated {estimate * 1000:.0f} ms); retry after {retry} s or raise "
                "ttft_budget_ms", status=429, type="rate_limit_error",
                param="ttft_budget_ms", code="ttft_budget_exceeded",
                headers={"Retry-After": str(retry)})
        return raw


class QueueLimits:
    """--max-queued-requests / --max-queued-tokens: requests waiting for their first token,
    and their prompt tokens, beyond which new requests get 429 + Retry-After."""

    def __init__(self, admission: AdmissionController, max_requests: int | None = None,
                 max_tokens: int | None = None):
        self.admission = admission
        self.max_requests = max_requests
        self.max_tokens = max_tokens

    def check(self, queue: list[QueueItem], decode_seqs: int,
              new: QueueItem | None = None) -> None:
        """APIError(429) when `queue` (plus `new`, once known) is over a limit."""
        tokens = sum(q.prefill_tokens for q in queue) + (new.prefill_tokens if new else 0)
        if self.max_requests is not None and len(queue) >= self.max_requests:
            what = f"{len(queue)} requests are already waiting (--max-queued-requests " \
                   f"{self.max_requests})"
        elif self.max_tokens is not None and queue and tokens > self.max_tokens:
            what = f"{tokens} prompt tokens would be waiting (--max-queued-tokens " \
                   f"{self.max_tokens})"
        else:
            return  # (one request alone is never refused for its size: the context is its cap)
        # the queue drains at about the rate admission control estimates for its last job
        drain = self.admission.estimate_ttft(queue[-1], queue[:-1], decode_seqs) if queue else 1
        retry = max(1, math.ceil(drain))
        raise APIError(f"{what}; retry after {retry} s", status=429, type="rate_limit_error",
                       code="queue_full", headers={"Retry-After": str(retry)})
