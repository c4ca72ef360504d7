"""Suffix decoding: proposals from the outputs of recent requests (any request, not just
this one). Every n-gram (n = min_n..max_n) of a finished output maps to counts of the token
that followed it; a proposal walks from the sequence's own last tokens, each time taking the
most frequent next token after the longest known context while it is frequent enough.
Memory is bounded: the oldest outputs are forgotten (their counts removed) past max_tokens.
"""

from __future__ import annotations

from collections import Counter, deque

MIN_SHARE = 0.3  # a continuation seen in less than this share of its context's cases stops


class SuffixIndex:
    def __init__(self, min_n: int, max_n: int, num_tokens: int, max_tokens: int = 1 << 18):
        self.min_n, self.max_n, self.num_tokens = min_n, max_n, num_tokens
        self.max_tokens = max_tokens  # output tokens remembered, across requests
        self.next: dict[tuple[int, ...], Counter] = {}
        self.outputs: deque[list[int]] = deque()
        self.size = 0

    def add(self, tokens: list[int]) -> None:
        """Remember one finished output (with the prompt tail it continued)."""
        if len(tokens) <= self.min_n:
            return
        self._count(tokens, +1)
        self.outputs.append(tokens)
        self.size += len(tokens)
        while self.size > self.max_tokens:
            old = self.outputs.popleft()
            self.size -= len(old)
            self._count(old, -1)

    def _count(self, tokens: list[int], delta: int) -> None:
        for end in range(self.min_n, len(tokens)):
            follow = tokens[end]
            for n in range(self.min_n, min(self.max_n, end) + 1):
                key = tuple(tokens[end - n:end])
                counts = self.next.setdefault(key, Counter())
                counts[follow] += delta
                if counts[follow] <= 0:
                    del counts[follow]
                    if not counts:
                        del self.next[key]

    def propose(self, token_ids: list[int], limit: int | None = None) -> list[int]:
        k = self.num_tokens if limit is None else min(self.num_tokens, limit)
        context = list(token_ids[-self.max_n:])
        out: list[int] = []
        while len(out) < k:
            guess = self._next(context)
            if guess is None:
                break
            out.append(guess)
            context = (context + [guess])[-self.max_n:]
        return out

    def _next(self, context: list[int]) -> int | None:
        for n in range(min(self.max_n, len(context)), self.min_n - 1, -1):
            counts = self.next.get(tuple(context[-n:]))
            if counts:
                token, count = counts.most_common(1)[0]
                return token if count >= MIN_SHARE * sum(counts.values()) else None
        return None
