"""Prompt logprobs (vLLM's `prompt_logprobs`, OpenAI completions' `echo` with `logprobs`):
the model's log-probability of each prompt token given the tokens before it, with the k
likeliest alternatives, computed from the prefill's own hidden states.

Position p's logits score prompt token p + 1, so a chunk [start, end) of a prefill gives
rows for the prompt tokens start + 1 .. min(end, P - 1) (P: the prompt's length); the first
prompt token has no entry (None, as in vLLM). Entries are stored by position, so a
preempted request that prefills again overwrites them rather than appending twice.
"""

from __future__ import annotations

import torch

from graft.serving.engine.sequence import Sequence

# prompt tokens one step scores, over all its sequences: their logits are [rows, vocab] fp32
# (256 x 152k is 156 MB), where the other requests keep one row each
STEP_TOKENS = 256


def wanted(seq: Sequence) -> bool:
    return seq.params.prompt_logprobs is not None


def positions(seq: Sequence, start: int, end: int) -> range:
    """The positions of chunk [start, end) whose logits score a prompt token."""
    if not wanted(seq):
        return range(0)
    return range(start, max(start, min(end, seq.num_prompt_tokens - 1)))


class StepRows:
    """The scheduler's count of the prompt tokens one step scores (at most STEP_TOKENS)."""

    def __init__(self):
        self.left = STEP_TOKENS

    def limit(self, seq: Sequence, n: int) -> int:
        """n tokens of seq's next chunk, cut to what the step can still score while seq's
        prompt needs logprobs (0: wait for the next step); those are counted as taken."""
        if not wanted(seq) or seq.num_computed_tokens >= seq.num_prompt_tokens - 1:
            return n
        n = min(n, self.left)
        self.left -= n
        return n


def record(rows: list[tuple[Sequence, int, torch.Tensor]]) -> None:
    """Store the entries of each (seq, first position, logits [n, vocab]) of a step: {token
    id: logprob} of the k likeliest and of the prompt's own token, from the model's raw
    distribution, and the own token's rank (1: the likeliest; vLLM's). An image position's
    placeholder gets None: it is not a token."""
    for seq, first, logits in rows:
        if seq.is_finished:
            continue
        lp = torch.log_softmax(logits.float(), dim=-1)
        targets = seq.token_ids[first + 1:first + 1 + lp.shape[0]]
        own = lp.gather(1, torch.tensor(targets, device=lp.device).clamp(min=0)[:, None])
        ranks = ((lp > own).sum(dim=1) + 1).tolist()
        k = seq.params.prompt_logprobs
        top = torch.topk(lp, k) if k > 0 else None
        tops = ([dict(zip(i, v)) for i, v in zip(top.indices.tolist(), top.values.tolist())]
                if top is not None else [{} for _ in targets])
        for i, (token, value, entry) in enumerate(zip(targets, own[:, 0].tolist(), tops)):
            at = first + 1 + i
            if token >= 0:
                entry[token] = value
            seq.prompt_logprobs[at] = entry if token >= 0 else None
            seq.prompt_ranks[at] = ranks[i] if token >= 0 else None
