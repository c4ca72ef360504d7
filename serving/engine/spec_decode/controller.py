"""Which sequences speculate this step and how many tokens, per-sequence acceptance, the
adaptive back-off, and the engine-wide acceptance counters."""

from __future__ import annotations

from dataclasses import dataclass

from graft.serving.engine.config import EngineConfig
from graft.serving.engine.sequence import Sequence
from graft.serving.engine.spec_decode.ngram import NgramProposer
from graft.serving.engine.spec_decode.suffix import SuffixIndex
from graft.serving.engine.step_cost import StepCostModel

# adaptive rule: a verify step costs more than a plain decode step (on CPU a plain step is
# one C call, a verify step runs op by op, and every proposed token is a row through every
# linear), and in a batch it slows every sequence of the step while only the verifying one
# gains its accepted tokens. So every WINDOW verify steps a sequence's acceptance is weighed
# against the step costs the engine measured (graft.serving.engine.step_cost): with b
# sequences decoding, speculation pays when the step's tokens per second with it, (b + a) /
# verify_seconds(b + k rows), is at least b / plain_seconds(b rows) without it (a: accepted,
# k: proposed tokens per verify step, averaged over the window). When it does not pay the
# sequence pauses speculation for `pause` output tokens times b (the pause doubling each
# time, up to MAX_PAUSE), then probes again: a non-copying answer pays for a few failed
# verify steps, then decodes plainly
WINDOW = 4
FIRST_PAUSE, MAX_PAUSE = 16, 512
# proposal length: a sequence proposes at most one token more than it has been accepting
# lately (a moving average, EMA weight on the newest step): unaccepted rows cost time
EMA = 0.5


def speculation_pays(accepted: float, proposed: float, decoding: int, cost: StepCostModel) -> bool:
    """Whether verifying `proposed` tokens per step and accepting `accepted` of them emits at
    least as many tokens per second over a step of `decoding` sequences as plain decoding."""
    b = max(decoding, 1)
    plain = cost.decode_step_seconds(b, verifying=False)
    verify = cost.decode_step_seconds(b + proposed, verifying=True)
    return (b + accepted) * plain >= b * verify


@dataclass
class SpecState:
    """One sequence's speculation history."""

    proposed: int = 0  # tokens proposed over the whole request
    accepted: int = 0  # of them accepted
    steps: int = 0  # verify steps
    window_steps: int = 0  # since the last adaptive decision
    window_accepted: int = 0
    window_proposed: int = 0
    resume_at: int = 0  # output token count from which speculation may resume
    pause: int = FIRST_PAUSE
    recent_accepted: float = float("inf")  # moving average of accepted tokens per verify step


class SpecDecoder:
    def __init__(self, config: EngineConfig, max_model_len: int,
                 cost: StepCostModel | None = None):
        self.default = config.speculative
        # the engine's measured step costs (its own model, on the priors, when none is given)
        self.cost = cost if cost is not None else StepCostModel()
        self.max_model_len = max_model_len
        self.ngram = NgramProposer(config.ngram_min, config.ngram_max, config.num_speculative_tokens)
        self._config = config
        # one suffix table per graft (None: the bare LLM): a graft's answers never propose
        # tokens to another graft's requests, and each table has its own token bound
        self.suffixes: dict[str | None, SuffixIndex] = {}
        self.proposed = self.accepted = self.steps = 0  # engine-wide, for /metrics

    def suffix_table(self, graft: str | None = None) -> SuffixIndex:
        """The suffix table of `graft`'s requests (made on first use)."""
        if graft not in self.suffixes:
            c = self._config
            self.suffixes[graft] = SuffixIndex(c.ngram_min, c.ngram_max, c.num_speculative_tokens,
                                               c.suffix_cache_tokens)
        return self.suffixes[graft]

    @property
    def suffix(self) -> SuffixIndex:
        """The bare LLM's suffix table (requests that name no graft)."""
        return self.suffix_table(None)

    def mode(self, seq: Sequence) -> str:
        return seq.params.speculative or self.default

    def enabled(self, seq: Sequence) -> bool:
        # a guided sequence never speculates: its grammar mask depends on every token
        # before the position, and a matcher advances only on accepted tokens
        return self.mode(seq) != "off" and seq.matcher is None

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
        limit = min(budget, left) - 1
        if state is not None:
            limit = min(limit, int(state.recent_accepted + 0.5) + 1)  # rounded, so it can grow
        own = self.ngram.propose(seq.token_ids, limit)
        if self.mode(seq) != "suffix" or len(own) >= min(limit, self.ngram.num_tokens):
            return own
        seen = self.suffix_table(seq.graft).propose(seq.token_ids, limit)
        return seen if len(seen) > len(own) else own

    def observe(self, seq: Sequence) -> None:
        """A finished suffix-mode sequence's output (after its prompt's last tokens) joins
        the suffix index; image placeholders never do."""
        if self.mode(seq) != "suffix" or not seq.num_output_tokens:
            return
        table = self.suffix_table(seq.graft)
        tokens = seq.token_ids[max(seq.num_prompt_tokens - table.max_n, 0):]
        negative = [i for i, t in enumerate(tokens) if t < 0]
        table.add(tokens[negative[-1] + 1:] if negative else tokens)

    def record(self, seq: Sequence, proposed: int, accepted: int, num_decoding: int = 1) -> None:
        """A verify step of seq proposed `proposed` tokens and `accepted` matched, in a step
        where `num_decoding` sequences decoded (seq included)."""
        state = seq.spec = seq.spec or SpecState()
        state.proposed += proposed
        state.accepted += accepted
        state.steps += 1
        state.window_steps += 1
        state.window_accepted += accepted
        state.window_proposed += proposed
        state.recent_accepted = (accepted if state.steps == 1 else
                                 (1 - EMA) * state.recent_accepted + EMA * accepted)
        self.proposed += proposed
        self.accepted += accepted
        self.steps += 1
        if state.window_steps >= WINDOW:
            n = state.window_steps
            if speculation_pays(state.window_accepted / n, state.window_proposed / n,
                                num_decoding, self.cost):
                state.pause = FIRST_PAUSE
            else:
                state.resume_at = seq.num_output_tokens + state.pause * max(num_decoding, 1)
                state.pause = min(2 * state.pause, MAX_PAUSE)
            state.window_steps = state.window_accepted = state.window_proposed = 0
