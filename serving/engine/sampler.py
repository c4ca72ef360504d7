"""Turn last-position logits into next tokens: the request's logits processors (bias,
penalties, min_tokens, grammar), then greedy or temperature, top-k, top-p, seeds.

Sampling uses the exponential-race trick (argmax of p / Exp(1) noise), so each row's
draw depends only on its own generator: a seeded request gives the same tokens in any
batch.
"""

from __future__ import annotations

import torch

from graft.kernels import argmax
from graft.serving.engine.logits_processors import Row, process_logits
from graft.serving.engine.sequence import Sequence


class Sampler:
    def __init__(self, device: torch.device, seed: int = 0, eos_token_ids: set[int] = frozenset()):
        self.device = device
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.eos_token_ids = set(eos_token_ids)  # what min_tokens holds back

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]):
        """logits [B, V] fp32 -> (token ids [B] list, per-row logprob dicts or None)."""
        return self.pick(self.process(logits, [(s, []) for s in seqs]), seqs, logits)

    def process(self, logits: torch.Tensor, rows: list[Row]) -> torch.Tensor:
        """The logits each row samples from (logits_processors.process_logits)."""
        return process_logits(logits, rows, self.eos_token_ids)

    def pick(self, logits: torch.Tensor, seqs: list[Sequence], raw: torch.Tensor):
        """Tokens from processed logits [B, V]; logprobs from the model's own (`raw`), as
        vLLM reports them by default."""
        greedy_ids = argmax(logits)  # [B]
        rows = [i for i, s in enumerate(seqs) if not s.params.greedy]
        tokens = greedy_ids
        if rows:
            tokens = greedy_ids.clone()
            idx = torch.tensor(rows, device=logits.device)
            tokens[idx] = self._sample(logits[idx], [seqs[i] for i in rows])
        token_list = tokens.tolist()
        logprobs = [None] * len(seqs)
        want = [i for i, s in enumerate(seqs) if s.params.logprobs is not None]
        if want:
            lp = torch.log_softmax(raw[want], dim=-1)  # raw model distribution
            for j, i in enumerate(want):
                logprobs[i] = logprob_entry(lp[j], seqs[i].params.logprobs, token_list[i])
        return token_list, logprobs

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        probs = self.probs(logits, seqs)
        noise = torch.empty_like(probs)
        seeded = [j for j, s in enumerate(seqs) if s.params.seed is not None]
        if len(seeded) < len(seqs):
            noise.exponential_(generator=self.generator)  # unseeded rows share one draw
        for j in seeded:  # a seeded row draws only from its own generator
            noise[j].exponential_(generator=self.generator_for(seqs[j]))
        return argmax(probs / noise)

    def generator_for(self, seq: Sequence) -> torch.Generator:
        """seq's own generator when it has a seed, else the engine's shared one."""
        if seq.params.seed is None:
            return self.generator
        if seq.generator is None:
            seq.generator = torch.Generator(device=self.device).manual_seed(seq.params.seed)
        return seq.generator

    @staticmethod
    def probs(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """The distribution each row samples from: temperature, then top-k, then top-p, then
        min-p (vLLM's order)."""
        vocab = logits.shape[-1]
        temps = torch.tensor([s.params.temperature for s in seqs], device=logits.device)
        logits = logits / temps[:, None]  # [b, V]
        ks = [s.params.top_k if 0 < s.params.top_k < vocab else vocab for s in seqs]
        if min(ks) < vocab:
            kth = torch.topk(logits, max(ks), dim=-1).values  # [b, max_k] descending
            k_idx = torch.tensor(ks, device=logits.device) - 1
            thresh = kth.gather(1, k_idx.clamp(max=kth.shape[1] - 1)[:, None])  # [b, 1]
            thresh = torch.where(k_idx[:, None] >= vocab - 1, torch.full_like(thresh, -float("inf")),
                                 thresh)
            logits = logits.masked_fill(logits < thresh, -float("inf"))
        top_ps = torch.tensor([s.params.top_p for s in seqs], device=logits.device)
        if bool((top_ps < 1.0).any()):
            sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
            probs = torch.softmax(sorted_logits, dim=-1)
            # drop a token when the mass strictly before it already reaches top_p; the first
            # stays whatever top_p is (a top_p below float32's smallest is 0 here)
            drop = (probs.cumsum(-1) - probs) >= top_ps[:, None]
            drop[:, 0] = False
            sorted_logits = sorted_logits.masked_fill(drop, -float("inf"))
            logits = torch.empty_like(logits).scatter_(1, order, sorted_logits)
        min_ps = torch.tensor([s.params.min_p for s in seqs], device=logits.device)
        if bool((min_ps > 0.0).any()):
            probs = torch.softmax(logits, dim=-1)
            keep = probs >= min_ps[:, None] * probs.max(dim=-1, keepdim=True).values
            logits = logits.masked_fill(~keep, -float("inf"))
        return torch.softmax(logits, dim=-1)


def seeded_rng_states(seqs: list[Sequence]) -> list[tuple[Sequence, torch.Tensor | None]]:
    """Where each seeded sequence's generator stands (None: not made yet), so a step that
    fails after drawing can be redrawn as if the failed draws never happened."""
    return [(s, None if s.generator is None else s.generator.get_state())
            for s in seqs if s.params.seed is not None]


def restore_rng_states(saved: list[tuple[Sequence, torch.Tensor | None]]) -> None:
    for seq, state in saved:
        if state is None:
            seq.generator = None  # made afresh from the seed on its next draw
        else:
            seq.generator.set_state(state)


def logprob_entry(lp: torch.Tensor, k: int, token: int) -> dict[int, float]:
    """{token id: logprob} of the k most likely tokens of one row, plus the chosen token."""
    top = torch.topk(lp, k) if k > 0 else None
    entry = {} if top is None else dict(zip(top.indices.tolist(), top.values.tolist()))
    entry[token] = float(lp[token])
    return entry
