"""Which sequences speculate this step and how many tokens, per-sequence acceptance, the
adaptive back-off, and the engine-wide acceptance counters."""

from __future__ import annotations

from dataclasses import dataclass

from graft.serving.engine.config import EngineConfig
from graft.serving.engine.sequence import Sequence
from graft.serving.engine.spec_decode.ngram import NgramProposer

# adaptive rule: after WINDOW proposed tokens, a sequence that accepted fewer than
# MIN_ACCEPTANCE of them pauses speculation for `pause` output tokens (doubling each time,
# up to MAX_PAUSE), so a non-copying answer pays for at most a few failed verify steps
WINDOW = 12
MIN_ACCEPTANCE = 0.25
FIRST_PAUSE, MAX_PAUSE = 16, 512


@dataclass
class SpecState:
    """One sequence's speculation history."""

    proposed: int = 0  # tokens proposed over the whole request
    accepted: int = 0  # of them accepted
    steps: int = 0  # verify steps
    window_proposed: int = 0  # since the last adaptive decision
    window_accepted: int = 0
    resume_at: int = 0  # output token count from which speculation may resume
    pause: int = FIRST_PAUSE


class SpecDecoder:
    def __init__(self, config: EngineConfig, max_model_len: int):
        self.default = config.speculative
        self.max_model_len = max_model_len
        self.ngram = NgramProposer(config.ngram_min, config.ngram_max, config.num_speculative_tokens)
        self.proposed = self.accepted = self.steps = 0  # engine-wide, for /metrics

    def enabled(self, seq: Sequence) -> bool:
        mode = seq.params.speculative or self.default
        return mode != "off"

    def propose(self, seq: Sequence, budget: int) -> list[int]:
        """Proposals for a decoding seq, at most budget - 1 (its own token comes first)."""
        if not self.enabled(seq):
            return []
        state = seq.spec
        if state is not None and seq.num_output_tokens < state.resume_at:
            return []
        # more tokens than the request may still emit (or the context holds) would be wasted:
        # a step emits up to len(proposal) + 1 tokens
        left = min(seq.params.max_tokens - seq.num_output_tokens, self.max_model_len - len(seq))
        return self.ngram.propose(seq.token_ids, min(budget, left) - 1)

    def record(self, seq: Sequence, proposed: int, accepted: int) -> None:
        """A verify step of seq proposed `proposed` tokens and `accepted` matched."""
        state = seq.spec = seq.spec or SpecState()
        state.proposed += proposed
        state.accepted += accepted
        state.steps += 1
        state.window_proposed += proposed
        state.window_accepted += accepted
        self.proposed += proposed
        self.accepted += accepted
        self.steps += 1
        if state.window_proposed >= WINDOW:
            if state.window_accepted < MIN_ACCEPTANCE * state.window_proposed:
                state.resume_at = seq.num_output_tokens + state.pause
                state.pause = min(2 * state.pause, MAX_PAUSE)
            else:
                state.pause = FIRST_PAUSE
            state.window_proposed = state.window_accepted = 0
