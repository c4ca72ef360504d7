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

    @classmethod
    def of(cls, engine) -> "EngineStats":
        """The state of `engine` (graft.serving.engine.engine.Engine) now."""
        bm, scheduler, spec = engine.block_manager, engine.scheduler, engine.spec
        c0, c1, c2 = engine.cost.coefficients
        fitted = engine.cost.fitted
        return cls(
            num_waiting=len(scheduler.waiting),
            num_running=len(scheduler.running),
            queued_prefill_tokens=scheduler.queued_prefill_tokens(),
            prefill_seconds_per_token=c1 if fitted else None,
            decode_step_seconds=c0 + c2 * max(len(scheduler.running), 1) if fitted else None,
            free_kv_blocks=bm.num_free_blocks,
            total_kv_blocks=bm.num_blocks,
            prefix_cache_hit_rate=bm.hit_tokens / bm.query_tokens if bm.query_tokens else 0.0,
            num_preemptions=scheduler.num_preemptions,
            spec_proposed_tokens=spec.proposed,
            spec_accepted_tokens=spec.accepted,
            spec_verify_steps=spec.steps,
        )
