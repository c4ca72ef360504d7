"""Per-request image inputs the engine consumes: placeholder ranges and their embeddings.

The multimodal layer fills these; the engine only hashes ranges into prefix-cache keys
and splices the embedding rows of the positions each prefill chunk computes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Union

if TYPE_CHECKING:  # torch loads lazily: importing graft.serving must stay cheap for the CLI
    import torch

EmbedSource = Union["torch.Tensor", Callable[[], "torch.Tensor"]]


@dataclass
class ImageRange:
    offset: int  # first prompt position of the placeholder run
    length: int  # number of placeholder positions (= rows of embeds)
    content_hash: str  # identity of the image (pixels + preprocessing + encoder/adapter)
    embeds: EmbedSource  # [length, d_model], or a zero-arg callable producing it on demand

    def get_embeds(self) -> "torch.Tensor":
        rows = self.embeds() if callable(self.embeds) else self.embeds
        if rows.dim() != 2 or rows.shape[0] != self.length:
            raise ValueError(
                f"image {self.content_hash!r} at offset {self.offset}: embeddings have shape "
                f"{tuple(rows.shape)}, expected [{self.length}, d_model]")
        self.embeds = rows  # resolve once; preemption recompute reuses it
        return rows


@dataclass
class MultiModalInputs:
    ranges: list[ImageRange] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ranges = sorted(self.ranges, key=lambda r: r.offset)

    def overlapping(self, start: int, end: int) -> list[ImageRange]:
        return [r for r in self.ranges if r.offset < end and start < r.offset + r.length]

    def extra_key(self, start: int, end: int) -> str | None:
        """Prefix-cache key part of the block [start, end): every image touching it."""
        hits = self.overlapping(start, end)
        if not hits:
            return None
        return "|".join(f"{r.content_hash}@{r.offset}" for r in hits)

    def rows_for(self, start: int, end: int) -> "torch.Tensor | None":
        """Embedding rows of the placeholder positions in [start, end), in position order."""
        parts = []
        for r in self.overlapping(start, end):
            lo, hi = max(start, r.offset) - r.offset, min(end, r.offset + r.length) - r.offset
            parts.append(r.get_embeds()[lo:hi])
        if not parts:
            return None
        import torch

        return torch.cat(parts)
