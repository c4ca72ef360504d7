"""One request's state inside the engine: tokens, KV blocks, progress, finish reason."""

from __future__ import annotations

import enum
import time

from graft.serving.engine.mm_inputs import MultiModalInputs
from graft.serving.engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """Prompt + generated tokens; KV for the first `num_computed_tokens` lives in `block_table`."""

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        order: int,
        mm_inputs: MultiModalInputs | None = None,
        deadline: float | None = None,
        priority: int | None = None,
        graft: str | None = None,
    ):
        self.request_id = request_id
        self.graft = graft  # the graft that asked (None: the bare LLM or the default graft)
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.token_ids)
        self.params = params
        self.order = order  # arrival counter: FCFS tie-break
        self.mm_inputs = mm_inputs
        self.deadline = deadline
        self.priority = priority
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        self.block_hashes: list[bytes] = []  # chain hashes of the full blocks registered so far
        self.num_cached_tokens = 0  # prompt tokens served from the prefix cache (or transferred)
        self.kv_export = False  # hold the prompt's KV for a decode engine once finished
        self.num_transferred_tokens = 0  # prompt tokens whose KV came from another engine
        self.num_preemptions = 0
        self.finish_reason: str | None = None
        # vLLM's: the stop token id or stop string that ended it (None: eos, length, ...)
        self.stop_reason: int | str | None = None
        self.error: str | None = None
        self.logprobs: list[dict[int, float]] = []
        # by prompt position (prompt_logprobs.py), with the prompt token's rank; the first has none
        wanted = params.prompt_logprobs is not None
        self.prompt_logprobs: list[dict[int, float] | None] | None = (
            [None] * self.num_prompt_tokens if wanted else None)
        self.prompt_ranks: list[int | None] | None = (
            [None] * self.num_prompt_tokens if wanted else None)
        self.pooling = None  # pooling.PoolingParams: an embedding request, nothing sampled
        self.pool_parts: dict = {}  # its pooled rows' sums by chunk (pooling.record)
        self.embedding: list[float] | None = None  # ... and the vector, once its prompt is done
        self.generator = None  # torch.Generator when params.seed is set
        self.spec_tokens: list[int] = []  # proposals verified in this step (after the last token)
        self.spec = None  # spec_decode.controller.SpecState once the sequence has speculated
        self.matcher = None  # llguidance.LLMatcher when params.guided_json is set (guided.py)
        self.waiting_matcher = None  # the matcher until params.guided_after_token is sampled
        self.arrival_time = time.monotonic()
        self.first_token_time: float | None = None
        self.finish_time: float | None = None
        # output text state (see outputs.Detokenizer)
        self.text = ""
        self.sent_tokens = 0  # output tokens already reported by step()
        self.sent_text = 0  # characters of text already reported by step()
        self.detok_state = None

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_uncomputed(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def queue_key(self) -> tuple:
        """Waiting order: earliest deadline first, then priority (low first), then arrival."""
        has_deadline = self.deadline is not None
        return (0 if has_deadline else 1, self.deadline if has_deadline else 0.0,
                self.priority or 0, self.order)

    def block_extra_key(self, index: int, block_size: int) -> str | None:
        if self.mm_inputs is None:
            return None
        return self.mm_inputs.extra_key(index * block_size, (index + 1) * block_size)


def prompt_problem(seq: Sequence, max_model_len: int, vocab_size: int) -> str | None:
    """Why the engine cannot take `seq`'s prompt (one line naming the request and the fix),
    or None: empty, longer than the context, ids outside the vocabulary, image placeholders
    and mm_inputs ranges that do not match."""
    from graft.inject import IMAGE_PLACEHOLDER

    ids, rid = seq.token_ids, seq.request_id
    if not ids:
        return f"request {rid!r}: the prompt is empty"
    if len(ids) > max_model_len:
        return (f"request {rid!r}: prompt has {len(ids)} tokens but the model's context "
                f"(max_model_len) is {max_model_len}; shorten the prompt")
    bad = [t for t in ids if t >= vocab_size or (t < 0 and t != IMAGE_PLACEHOLDER)]
    if bad:
        return f"request {rid!r}: token ids {bad[:4]} are outside the vocabulary [0, {vocab_size})"
    covered = set()
    for r in (seq.mm_inputs.ranges if seq.mm_inputs is not None else []):
        span = range(r.offset, r.offset + r.length)
        if r.offset < 0 or span.stop > len(ids) or any(ids[p] != IMAGE_PLACEHOLDER for p in span):
            return (f"request {rid!r}: image range offset={r.offset} length={r.length} does "
                    "not cover a run of IMAGE_PLACEHOLDER ids in the prompt")
        covered.update(span)
    if sum(1 for t in ids if t == IMAGE_PLACEHOLDER) != len(covered):
        return (f"request {rid!r}: the prompt holds image placeholder ids without matching "
                "mm_inputs ranges; pass mm_inputs for every image")
    return None
