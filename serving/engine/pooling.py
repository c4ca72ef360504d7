"""Embeddings from the LLM (vLLM's pooling requests, llama.cpp's `--embeddings`): one vector per
prompt, pooled from the hidden states after the model's final norm (HF's last_hidden_state),
then L2-normalized unless asked not to be.

A pooling request is prefilled like any prompt (chunked, batched beside generating requests,
preemptible) and finishes once its prompt is computed, with no token sampled. `last` pools
the prompt's last position, so it takes prefix-cache hits (the last token is always computed);
`mean` and `cls` read positions a hit would skip, so they compute the whole prompt, as prompt
logprobs do. A chunk's rows are summed by the chunk's first position: a batch that fails and
runs each request again overwrites what it wrote, and a preempted request that prefills again
from position 0 starts over.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graft.errors import GraftConfigError
from graft.serving.engine import prompt_logprobs
from graft.serving.engine.sequence import Sequence

POOLING_TYPES = ("last", "mean", "cls")


@dataclass
class PoolingParams:
    """How one prompt becomes its embedding: `pooling` last (the last position: causal models'
    choice, vLLM's default for them), mean (every position) or cls (the first); `normalize`
    to unit L2 norm (vLLM's and llama.cpp's default)."""

    pooling: str = "last"
    normalize: bool = True

    def __post_init__(self) -> None:
        if self.pooling not in POOLING_TYPES:
            raise GraftConfigError(f"PoolingParams.pooling must be one of "
                                   f"{', '.join(POOLING_TYPES)}, got {self.pooling!r}")
        if not isinstance(self.normalize, bool):
            raise GraftConfigError(
                f"PoolingParams.normalize must be a bool, got {self.normalize!r}")


def whole_prompt(seq: Sequence) -> bool:
    """Every prompt position must be computed here: no prefix-cache hits, no transferred KV."""
    pools_more = seq.pooling is not None and seq.pooling.pooling != "last"
    return prompt_logprobs.wanted(seq) or pools_more


def positions(seq: Sequence, start: int, end: int) -> range:
    """The positions of chunk [start, end) whose hidden states seq's pooling reads."""
    if seq.pooling is None:
        return range(0)
    kind, last = seq.pooling.pooling, seq.num_prompt_tokens - 1
    if kind == "last":
        return range(last, last + 1) if start <= last < end else range(0)
    if kind == "cls":
        return range(0, 1) if start == 0 else range(0)
    return range(start, end)


def record(rows: list[tuple[Sequence, int, torch.Tensor]]) -> None:
    """Keep each (seq, first position, hidden [n, d]) of a step as the sum of its rows."""
    for seq, first, hidden in rows:
        if first == 0:  # (again) from the start: a preempted prefill recomputes everything
            seq.pool_parts.clear()
        seq.pool_parts[first] = hidden.float().sum(dim=0)


def done(seq: Sequence) -> bool:
    return seq.pooling is not None and seq.num_computed_tokens >= seq.num_prompt_tokens


def embed(seq: Sequence) -> list[float]:
    """seq's embedding once its prompt is computed: the pooled rows, normalized if asked."""
    total = torch.stack(list(seq.pool_parts.values())).sum(dim=0)
    if seq.pooling.pooling == "mean":
        total = total / seq.num_prompt_tokens
    if seq.pooling.normalize:
        total = torch.nn.functional.normalize(total, dim=0)
    return total.tolist()
