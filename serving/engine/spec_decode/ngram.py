"""Prompt-lookup proposals: the tokens that followed the latest earlier occurrence of the
sequence's last n tokens (prompt and output alike), longest n first."""

from __future__ import annotations


class NgramProposer:
    def __init__(self, min_n: int, max_n: int, num_tokens: int):
        self.min_n, self.max_n, self.num_tokens = min_n, max_n, num_tokens

    def propose(self, token_ids: list[int], limit: int | None = None) -> list[int]:
        """Up to min(num_tokens, limit) guessed continuations of token_ids; [] if no match."""
        k = self.num_tokens if limit is None else min(self.num_tokens, limit)
        size = len(token_ids)
        if k <= 0 or size <= self.min_n:
            return []
        for n in range(min(self.max_n, size - 1), self.min_n - 1, -1):
            pattern = token_ids[size - n:]
            # latest match first: recent context predicts the continuation best; the match
            # must end before the suffix itself so at least one token follows it
            first = pattern[0]
            for start in range(size - n - 1, -1, -1):
                if token_ids[start] == first and token_ids[start:start + n] == pattern:
                    return _until_placeholder(_follow(token_ids, start + n, k))
        return []


def _follow(token_ids: list[int], at: int, k: int) -> list[int]:
    """k tokens copied from position `at` on; where the copy reaches the end it goes on over
    the proposal itself, so a repeating run (a a a ..., ab ab ...) proposes k tokens too."""
    size = len(token_ids)
    out: list[int] = []
    for i in range(at, at + k):
        out.append(token_ids[i] if i < size else out[i - size])
    return out


def _until_placeholder(tokens: list[int]) -> list[int]:
    """Image placeholder ids (< 0) are never proposed: their rows come from the encoder."""
    for i, t in enumerate(tokens):
        if t < 0:
            return tokens[:i]
    return tokens
