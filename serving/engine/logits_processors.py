"""What a request changes in its logits before sampling: allowed_token_ids, bad words,
logit_bias, min_tokens, the repetition / frequency / presence penalties and the
guided-decoding grammar mask.

The order is HF transformers' and vLLM's: the allowed set and bad words (masks: nothing
after them brings a masked token back), bias, then min_tokens, then the penalties (so a
biased logit is then penalized), then the grammar, which is a hard constraint and so comes
last. Each row is a sequence plus the proposals before its position in a verify step
(spec_decode), so a row sees exactly the tokens it would see without speculation.
"""

from __future__ import annotations

import torch

from graft.errors import GraftConfigError
from graft.serving.engine.guided import allowed_tokens
from graft.serving.engine.sequence import Sequence

Row = tuple[Sequence, list[int]]  # (sequence, proposals that precede this row's position)


NO_TOKEN_LEFT = "allowed_token_ids and bad_words leave no token"  # how NoTokenLeft starts


class NoTokenLeft(GraftConfigError):
    """A request's allowed_token_ids and bad words exclude every token at some position: it
    ends alone with finish_reason "error" (engine._fail)."""


def changes_logits(seq: Sequence) -> bool:
    p = seq.params
    return bool(p.logit_bias or p.min_tokens or p.presence_penalty or p.frequency_penalty
                or p.repetition_penalty != 1.0 or seq.matcher is not None
                or p.allowed_token_ids is not None or p.bad_words_token_ids)


def process_logits(logits: torch.Tensor, rows: list[Row], eos_token_ids: set[int]) -> torch.Tensor:
    """logits [len(rows), V] -> the logits each row samples from (a new tensor when any row
    changes; the model's logits are left as they were, for logprobs)."""
    todo = [i for i, (seq, _) in enumerate(rows) if changes_logits(seq)]
    if not todo:
        return logits
    logits = logits.clone()
    vocab = logits.shape[-1]
    for i in todo:
        seq, extra = rows[i]
        p = seq.params
        row = logits[i]  # a view: edits land in `logits`
        if p.allowed_token_ids is not None:
            blocked = torch.ones(vocab, dtype=torch.bool, device=row.device)
            blocked[p.allowed_token_ids] = False
            row.masked_fill_(blocked, -float("inf"))
        if p.bad_words_token_ids:
            row[_bad_words(p.bad_words_token_ids, seq.output_token_ids + list(extra))] = \
                -float("inf")
        if (p.allowed_token_ids is not None or p.bad_words_token_ids) and \
                bool(torch.isneginf(row).all()):
            raise NoTokenLeft(f"{NO_TOKEN_LEFT} to sample after "
                              f"{seq.num_output_tokens + len(extra)} output tokens; allow more "
                              "tokens or ban fewer words")
        if p.logit_bias:
            ids = torch.tensor(list(p.logit_bias), device=row.device)
            row.index_add_(0, ids, torch.tensor(list(p.logit_bias.values()), device=row.device,
                                                dtype=row.dtype))
        if seq.num_output_tokens + len(extra) < p.min_tokens:
            stops = set(p.stop_token_ids) | (set() if p.ignore_eos else eos_token_ids)
            stop_ids = [t for t in stops if t < vocab]
            if stop_ids:
                held = row[stop_ids].clone()
                row[stop_ids] = -float("inf")
                if bool(torch.isneginf(row).all()):  # allowed_token_ids left only stops: they
                    row[stop_ids] = held  # win over min_tokens, as a grammar does
        if p.repetition_penalty != 1.0 or p.presence_penalty or p.frequency_penalty:
            _penalize(row, seq, extra, vocab)
    guided = [i for i in todo if rows[i][0].matcher is not None]
    if guided:
        if any(rows[i][1] for i in guided):
            raise RuntimeError("guided sequences do not speculate; a row has proposals")
        allowed = allowed_tokens([rows[i][0].matcher for i in guided], vocab, logits.device)
        idx = torch.tensor(guided, device=logits.device)
        masked = logits[idx].masked_fill(~allowed, -float("inf"))
        # the grammar wins over min_tokens: a row whose allowed tokens were all masked as
        # stops picks among them uniformly
        empty = torch.isneginf(masked).all(-1)  # [n]
        if bool(empty.any()):
            masked[empty] = torch.zeros_like(masked[empty]).masked_fill(~allowed[empty],
                                                                        -float("inf"))
        logits[idx] = masked
    return logits


def _bad_words(words: list[list[int]], output: list[int]) -> list[int]:
    """The tokens that would complete a bad word now: each word's last token where the
    output ends with the tokens before it (a one-token word: always), as vLLM masks them."""
    return [w[-1] for w in words
            if len(w) == 1 or output[len(output) - len(w) + 1:] == w[:-1]]


def _penalize(row: torch.Tensor, seq: Sequence, extra: list[int], vocab: int) -> None:
    """vLLM semantics: repetition over prompt + output (a seen token's positive logit is
    divided by the penalty, a negative one multiplied: HF's RepetitionPenaltyLogitsProcessor),
    frequency and presence over the output only (OpenAI: minus f * count, minus p if seen)."""
    p = seq.params
    output = torch.tensor(seq.output_token_ids + list(extra), dtype=torch.int64)
    counts = torch.bincount(output, minlength=vocab)[:vocab].to(row.device, row.dtype)  # [V]
    if p.repetition_penalty != 1.0:
        prompt = torch.tensor([t for t in seq.token_ids[:seq.num_prompt_tokens] if t >= 0],
                              dtype=torch.int64)
        seen = counts > 0
        seen[prompt[prompt < vocab].to(row.device)] = True
        pen = torch.where(row > 0, row / p.repetition_penalty, row * p.repetition_penalty)
        # a penalty near 0 divides a logit past the float range: keep it the largest finite
        row.copy_(torch.where(seen, pen, row).clamp_(max=torch.finfo(row.dtype).max))
    if p.frequency_penalty:
        row.sub_(p.frequency_penalty * counts)
    if p.presence_penalty:
        row.sub_(p.presence_penalty * (counts > 0).to(row.dtype))
