"""What `Engine.stats()` reports: queue, timing (from the engine's cost model), KV pool,
prefix cache, preemption and speculation counters."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineStats:
    """Queue and timing state an admission controller can read."""

    num_waiting: int
    num_running: int
    queued_prefill_tokens: int  # prompt tokens not yet computed (waiting + running chunks)
    prefill_seconds_per_token: float | None  # the cost model's fitted prefill cost (None: unfitted)
    decode_step_seconds: float | None  # ... and its decode step at the running batch size
    free_kv_blocks: int
    total_kv_blocks: int
    prefix_cache_hit_rate: float  # prompt tokens served from cache / prompt tokens admitted
    num_preemptions: int
    spec_proposed_tokens: int = 0  # speculative decoding: tokens proposed ...
    spec_accepted_tokens: int = 0  # ... and accepted
    spec_verify_steps: int = 0  # (sequence, step) pairs that verified proposals
