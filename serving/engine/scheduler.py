"""Continuous batching: one token budget per step, chunked prefill, recompute preemption.

Each step: running decodes first (never starved by prefills), then running prefill
chunks, then new requests in earliest-deadline-first order while budget, sequence slots
and KV blocks last and the step's prompt tokens are under max_prefill_tokens. When a
running sequence needs a block and none is free, the most recently admitted unscheduled
sequence is preempted (its blocks freed; it recomputes later).
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field

from graft.serving.engine import pooling, prompt_logprobs
from graft.serving.engine.block_manager import BlockManager
from graft.serving.engine.config import EngineConfig
from graft.serving.engine.sequence import Sequence, SequenceStatus

# how a user makes the pool bigger, in the server's words and the Python API's
POOL_FIX = ("raise graft serve's --num-kv-blocks or --kv-cache-memory (EngineConfig.num_kv_blocks "
            "or kv_cache_memory)")


@dataclass
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)  # single-token chunks first
    num_tokens: list[int] = field(default_factory=list)  # tokens computed per sequence
    # (a speculating decode's count includes its proposals, seq.spec_tokens)
    num_decodes: int = 0  # leading entries with exactly one token

    @property
    def total_tokens(self) -> int:
        return sum(self.num_tokens)

    def __bool__(self) -> bool:
        return bool(self.seqs)


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager):
        self.config = config
        self.bm = self.block_manager = block_manager
        self.waiting: list[Sequence] = []  # sorted by Sequence.queue_key
        self.running: list[Sequence] = []  # admission order
        self.num_preemptions = 0
        self._preempted_now = False
        self.spec = None  # spec_decode.SpecDecoder when the engine may speculate
        self.exports = None  # kv_transfer.KVExports: finished prompts held for a decode engine

    # --- queues ---------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        bisect.insort(self.waiting, seq, key=Sequence.queue_key)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence, reason: str, error: str | None = None) -> None:
        """Stop seq for good and return its blocks to the pool."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        if seq.kv_export and reason in ("stop", "length") and self.exports is not None:
            self.exports.hold(seq)
        self.bm.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.error = error
        seq.finish_time = time.monotonic()

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.bm.free(seq)  # recompute later; cached blocks may still be hit then
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self._preempted_now = True
        self.add(seq)

    def queued_prefill_tokens(self) -> int:
        pending = sum(len(s) - s.num_computed_tokens for s in self.waiting)
        return pending + sum(s.num_uncomputed for s in self.running if s.num_uncomputed > 1)

    # --- one step -------------------------------------------------------------------
    def blocks_wanted(self) -> int:
        """Free blocks the next step would use at most: one per running sequence, and the
        first waiting prompt's."""
        head = self.waiting[0] if self.waiting else None
        return len(self.running) + (self.bm.blocks_for(len(head) + 1) if head is not None else 0)

    def schedule(self, now: float | None = None) -> tuple[ScheduledBatch, list[Sequence]]:
        """Pick this step's work; also return sequences finished here (deadline, no room)."""
        now = time.monotonic() if now is None else now
        finished: list[Sequence] = []
        for seq in self.waiting + self.running:
            if seq.deadline is not None and now > seq.deadline:
                self.finish(seq, "deadline", "request passed its deadline before finishing")
                finished.append(seq)

        budget = self.config.max_num_batched_tokens
        self._preempted_now = False
        decodes: list[tuple[Sequence, int]] = []
        chunks: list[tuple[Sequence, int]] = []
        scheduled: set[int] = set()
        scoring = prompt_logprobs.StepRows()
        # decodes, then unfinished prefills; both from the running set
        for want_decode in (True, False):
            for seq in list(self.running):
                if budget == 0:
                    break
                if seq.status is not SequenceStatus.RUNNING or id(seq) in scheduled:
                    continue
                if (seq.num_uncomputed == 1) != want_decode:
                    continue
                # a decode may carry proposals to verify (spec_decode): its chunk is then
                # 1 + len(draft) tokens, shrunk like a prefill chunk when blocks are short
                draft = self.spec.propose(seq, budget) if want_decode and self.spec else []
                want = scoring.limit(seq, min(seq.num_uncomputed + len(draft), budget))
                n = self._grow(seq, want, scheduled, finished) if want else 0
                if n:
                    seq.spec_tokens = draft[:n - seq.num_uncomputed]
                    (decodes if n == 1 else chunks).append((seq, n))
                    scheduled.add(id(seq))
                    budget -= n
        # admit waiting requests, unless this step already had to preempt (would thrash), while
        # its prompt tokens stay under max_prefill_tokens (the one crossing it runs whole)
        prefill = sum(n for s, n in chunks if not s.spec_tokens)  # (not a decode's proposals)
        while (self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs
               and prefill < self.config.step_prefill_tokens and not self._preempted_now):
            seq = self.waiting[0]
            if self.bm.blocks_for(len(seq) + 1) > self.bm.num_blocks:
                self.finish(seq, "length" if seq.num_output_tokens else "error",
                            f"the prompt needs {len(seq) + 1} tokens of KV cache but the pool "
                            f"holds {self.bm.num_blocks * self.bm.block_size}; {POOL_FIX}")
                finished.append(seq)
                continue
            # a sequence whose KV came from another engine arrives with its blocks; one that
            # wants prompt logprobs (or mean or cls pooling) computes every prompt position
            preloaded = bool(seq.block_table)
            lookup = not preloaded and not pooling.whole_prompt(seq)
            hits = self.bm.lookup(seq) if lookup else []
            tail = self.bm.lookup_tail(seq, hits) if lookup else None
            cached = (seq.num_computed_tokens if preloaded else
                      len(hits) * self.bm.block_size + (tail[1] if tail else 0))
            n = scoring.limit(seq, min(len(seq) - cached, budget))
            if n == 0:
                break  # the step scores no more prompt tokens: it waits for the next
            need = (self.bm.blocks_for(cached + n) - len(seq.block_table) - len(hits)
                    - (tail is not None))
            if need > self.bm.num_free_blocks - self.bm.num_reclaimed(hits, tail):
                break  # wait for running requests to release blocks
            self.waiting.pop(0)
            if not preloaded:
                self.bm.acquire_prefix(seq, hits, tail)
            self.bm.append_slots(seq, n)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            (decodes if n == 1 else chunks).append((seq, n))
            scheduled.add(id(seq))
            budget -= n
            prefill += n

        entries = decodes + chunks
        batch = ScheduledBatch([s for s, _ in entries], [n for _, n in entries], len(decodes))
        if self.bm.events.enabled:
            self.bm.announce_scheduled(batch)
        return batch, finished

    def _grow(self, seq: Sequence, n: int, scheduled: set[int], finished: list[Sequence]) -> int:
        """Reserve KV slots for n more tokens of a running seq, preempting others if needed."""
        bs = self.bm.block_size
        while not self.bm.append_slots(seq, n):
            room = (len(seq.block_table) + self.bm.num_free_blocks) * bs - seq.num_computed_tokens
            if n > 1 and room >= 1:
                n = room  # shrink a prefill chunk to what fits
                continue
            victims = [s for s in self.running if id(s) not in scheduled and s is not seq]
            if victims:
                self._preempt(victims[-1])
                continue
            if self.bm.blocks_for(len(seq) + 1) > self.bm.num_blocks or len(self.running) == 1:
                self.finish(seq, "length", f"KV cache pool is full for this sequence; {POOL_FIX}")
                finished.append(seq)
            else:
                self._preempt(seq)
            return 0
        return n
