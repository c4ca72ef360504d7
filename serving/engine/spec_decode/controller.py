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
# linear), and in a batch it slows every sequence of the step while only the verifying ones
# gain. So each verify step is weighed with the step costs the engine measured
# (graft.serving.engine.step_cost): its extra seconds over a plain step of the b decoding
# sequences, shared among the verifying ones by their proposed tokens, against the seconds
# plain decoding would have spent on the accepted tokens (plain_seconds(b) / b each). A
# sequence keeps a balance of these seconds, in units of what one failed verify step alone
# costs it: at most CREDIT_STEPS banked (a copying answer rides over a miss or two), and
# below -LOSS_STEPS it pauses speculation for `pause` output tokens times b (the pause
# doubling each time, up to MAX_PAUSE), then probes again from a zero balance: a
# non-copying answer pays for LOSS_STEPS + 1 failed verify steps per probe, then decodes
# plainly. In a batch each probe slows every sequence of its steps, so probes are short
LOSS_STEPS = 1
CREDIT_STEPS = 2
FIRST_PAUSE, MAX_PAUSE = 16, 512
# engine-wide: once GATE_FAILS sequences in a row paused on their first probe, a sequence that
# has not probed yet starts paused (FIRST_PAUSE times the batch), as if its own probe had
# failed: in a batch each first probe is a whole-batch verify step, and sequences that arrive
# together probe at different steps. Any sequence whose speculation clearly pays reopens it.
GATE_FAILS = 2
# proposal length: a sequence proposes at most one token more than it has been accepting
# lately (a moving average, EMA weight on the newest step): unaccepted rows cost time
EMA = 0.5


def speculation_gain(accepted: int, proposed: int, decoding: int, step_proposals: int,
                     cost: StepCostModel) -> float:
    """Seconds one sequence's speculation saved in a verify step (negative: lost): its
    `accepted` tokens at plain decoding's seconds per token, minus its share (`proposed` of
    the step's `step_proposals`) of the step's extra seconds over a plain step of the
    `decoding` sequences."""
    b = max(decoding, 1)
    plain = cost.decode_step_seconds(b, verifying=False)
    extra = cost.decode_step_seconds(b + step_proposals, verifying=True) - plain
    return accepted * plain / b - extra * proposed / max(step_proposals, proposed, 1)


@dataclass
class SpecState:
    """One sequence's speculation history."""

    proposed: int = 0  # tokens proposed over the whole request
    accepted: int = 0  # of them accepted
    steps: int = 0  # verify steps
    balance: float = 0.0  # seconds speculation saved (speculation_gain) since the last pause
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
        self.first_probe_fails = 0  # sequences in a row that paused on their first probe
        self.last_batch = 1  # sequences decoding in the last verify step

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
        # before the position, and a matcher advances only on accepted tokens (one that waits
        # for guided_after_token neither: an accepted run could pass it unmasked)
        return self.mode(seq) != "off" and seq.matcher is None and seq.waiting_matcher is None

    def propose(self, seq: Sequence, budget: int) -> list[int]:
        """Proposals for a decoding seq, at most budget - 1 (its own token comes first)."""
        if not self.enabled(seq):
            return []
        state = seq.spec
        if state is None and self.first_probe_fails >= GATE_FAILS:
            state = seq.spec = SpecState(resume_at=seq.num_output_tokens + FIRST_PAUSE * self.last_batch)
        if state is not None and seq.num_output_tokens < state.resume_at:
            return []
        # more tokens than the request may still emit (or the context holds) would be wasted:
        # a step emits up to len(proposal) + 1 tokens
        left = min(seq.params.max_tokens - seq.num_output_tokens, self.max_model_len - len(seq))
        limit = min(budget, left) - 1
        if state is not None and state.steps:
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

    def record(self, seq: Sequence, proposed: int, accepted: int, num_decoding: int = 1,
               step_proposals: int | None = None) -> None:
        """A verify step of seq proposed `proposed` tokens and `accepted` matched, in a step
        where `num_decoding` sequences decoded (seq included) and proposed `step_proposals`
        tokens in all (default: seq's alone)."""
        state = seq.spec = seq.spec or SpecState()
        state.proposed += proposed
        state.accepted += accepted
        state.steps += 1
        b, step_proposals = max(num_decoding, 1), proposed if step_proposals is None else step_proposals
        unit = max(-speculation_gain(0, proposed, b, proposed, self.cost), 1e-9)  # a solo miss
        gain = speculation_gain(accepted, proposed, b, step_proposals, self.cost)
        state.balance = min(state.balance + gain, CREDIT_STEPS * unit)
        state.recent_accepted = (accepted if state.steps == 1 else
                                 (1 - EMA) * state.recent_accepted + EMA * accepted)
        self.proposed += proposed
        self.accepted += accepted
        self.steps += 1
        self.last_batch = b
        if state.balance < -LOSS_STEPS * unit:
            if state.pause == FIRST_PAUSE and state.resume_at == 0:  # its first probe failed
                self.first_probe_fails += 1
            state.resume_at = seq.num_output_tokens + state.pause * b
            state.pause = min(2 * state.pause, MAX_PAUSE)
            state.balance = 0.0
        elif state.balance >= CREDIT_STEPS * unit:  # clearly paying: the back-off starts over
            state.pause = FIRST_PAUSE
            self.first_probe_fails = 0
