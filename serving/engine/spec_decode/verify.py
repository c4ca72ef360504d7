"""Turn a verify step's logits into tokens: each proposal is checked against the model's own
distribution at its position, so the output distribution is the non-speculative one.

Greedy: accept the longest prefix of the proposal equal to the argmax, then the argmax after
it. Sampling (the speculative-sampling rule with a one-hot draft, q = 1 at the proposed t):
accept t with probability p(t); on rejection draw from the residual max(p - q, 0), which is p
with t removed; if every proposal is accepted, draw one more token from the last position.
"""

from __future__ import annotations

import torch

from graft.kernels import argmax
from graft.serving.engine.sampler import Sampler, logprob_entry
from graft.serving.engine.sequence import Sequence


def sample_step(sampler: Sampler, logits: torch.Tensor, seqs: list[Sequence]):
    """New tokens and logprob entries per sampling sequence: one each from the sampler, or up
    to 1 + len(seq.spec_tokens) for a sequence verifying proposals."""
    if not seqs:
        return [], []
    if any(s.spec_tokens for s in seqs):
        return sample_with_proposals(sampler, logits, seqs)
    tokens, logprobs = sampler(logits, seqs)
    return [[t] for t in tokens], [[lp] for lp in logprobs]


def sample_with_proposals(sampler: Sampler, logits: torch.Tensor, seqs: list[Sequence]):
    """logits [sum(1 + len(spec_tokens)), V] -> (tokens per seq, logprob entries per seq).

    Sequences without proposals go through the sampler as in a plain step (same draws)."""
    counts = [1 + len(s.spec_tokens) for s in seqs]
    starts = [sum(counts[:i]) for i in range(len(seqs))]
    tokens: list[list[int]] = [[] for _ in seqs]
    logprobs: list[list] = [[] for _ in seqs]
    raw = logits  # the model's own distribution, for logprobs
    # row j of a verifying sequence sees its proposals before j as already generated
    logits = sampler.process(logits, [(s, s.spec_tokens[:j]) for s in seqs for j in range(
        1 + len(s.spec_tokens))])
    plain = [i for i, s in enumerate(seqs) if not s.spec_tokens]
    if plain:
        idx = [starts[i] for i in plain]
        got, lps = sampler.pick(logits[idx], [seqs[i] for i in plain], raw[idx])
        for i, t, lp in zip(plain, got, lps):
            tokens[i], logprobs[i] = [t], [lp]
    spec = [i for i, s in enumerate(seqs) if s.spec_tokens]
    sampled = [i for i in spec if not seqs[i].params.greedy]
    probs = {}
    if sampled:
        rows = [r for i in sampled for r in range(starts[i], starts[i] + counts[i])]
        row_seqs = [seqs[i] for i in sampled for _ in range(counts[i])]
        all_probs = sampler.probs(logits[rows], row_seqs)  # [rows, V]
        offset = 0
        for i in sampled:
            probs[i] = all_probs[offset:offset + counts[i]]
            offset += counts[i]
    best = argmax(logits).tolist() if len(sampled) < len(spec) else []
    for i in spec:
        seq, r = seqs[i], starts[i]
        if i in probs:
            tokens[i] = _accept_sampled(probs[i], seq.spec_tokens, sampler.generator_for(seq))
        else:
            tokens[i] = _accept_greedy(best[r:r + counts[i]], seq.spec_tokens)
        k = seq.params.logprobs
        if k is None:
            logprobs[i] = [None] * len(tokens[i])
        else:
            lp = torch.log_softmax(raw[r:r + len(tokens[i])], dim=-1)
            logprobs[i] = [logprob_entry(lp[j], k, t) for j, t in enumerate(tokens[i])]
    return tokens, logprobs


def _accept_greedy(argmax: list[int], draft: list[int]) -> list[int]:
    out = []
    for j, best in enumerate(argmax):
        out.append(best)
        if j == len(draft) or best != draft[j]:
            break
    return out


def _accept_sampled(probs: torch.Tensor, draft: list[int], gen: torch.Generator) -> list[int]:
    """probs [len(draft) + 1, V]: the distributions at each proposal and after the last."""
    out = []
    for j, t in enumerate(draft):
        u = float(torch.rand((), generator=gen, device=gen.device))
        if u < float(probs[j, t]):
            out.append(t)
            continue
        residual = probs[j].clone()
        residual[t] = 0.0  # max(p - one_hot(t), 0); multinomial normalizes
        if not float(residual.sum()) > 0.0:  # p(t) rounded below 1 with no mass elsewhere
            out.append(t)
            continue
        out.append(int(torch.multinomial(residual, 1, generator=gen)))
        return out
    out.append(int(torch.multinomial(probs[len(draft)], 1, generator=gen)))
    return out
