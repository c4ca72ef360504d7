"""Content-addressed cache of projected image embeddings, bounded in bytes.

Key = hash(decoded pixels, preprocessing settings, encoder identity, adapter identity).
Entries pinned by a live request are never evicted; the rest go least-recently-used first.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import torch


def cache_key(pixel_hash: str, preprocess: str, encoder_id: str, adapter_id: str) -> str:
    h = hashlib.sha256()
    for part in (pixel_hash, preprocess, encoder_id, adapter_id):
        h.update(part.encode())
        h.update(b"\0")  # separator: ("ab","c") and ("a","bc") must differ
    return h.hexdigest()


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@dataclass
class _Entry:
    value: torch.Tensor  # [n_image_tokens, d_model] projected embeddings
    nbytes: int
    owners: dict[str, int] = field(default_factory=dict)  # request id -> pin count


class EncoderCache:
    """LRU over unpinned entries; `bytes` never exceeds `max_bytes`."""

    def __init__(self, max_bytes: int):
        if max_bytes <= 0:
            raise ValueError(f"encoder cache max_bytes must be > 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __bool__(self) -> bool:
        return True  # an empty cache is still a cache (`if cache:` must not mean "has entries")

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    @property
    def pinned_bytes(self) -> int:
        with self._lock:
            return sum(e.nbytes for e in self._entries.values() if e.owners)

    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def can_fit(self, nbytes: int) -> bool:
        """Whether `nbytes` more could be stored now, evicting only unpinned entries."""
        return nbytes <= self.max_bytes - self.pinned_bytes

    def peek(self, key: str) -> torch.Tensor | None:
        """The entry, if held, without counting a hit or miss or refreshing its LRU place
        (another worker asking: graft.serving.http.fleet.encoder_peers)."""
        with self._lock:
            entry = self._entries.get(key)
            return entry.value if entry is not None else None

    def get(self, key: str, owner: str | None = None) -> torch.Tensor | None:
        """Look up (counting a hit or miss); with `owner`, pin the entry for that request."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self.hits += 1
            self._entries.move_to_end(key)
            if owner is not None:
                entry.owners[owner] = entry.owners.get(owner, 0) + 1
            return entry.value

    def put(self, key: str, value: torch.Tensor, owner: str | None = None) -> bool:
        """Store (and pin for `owner`); False when pinned entries leave no room for it."""
        nbytes = tensor_bytes(value)
        with self._lock:
            if key in self._entries:
                entry = self._entries[key]
                self._entries.move_to_end(key)
            else:
                if not self._make_room(nbytes):
                    return False
                entry = _Entry(value, nbytes)
                self._entries[key] = entry
                self.bytes += nbytes
            if owner is not None:
                entry.owners[owner] = entry.owners.get(owner, 0) + 1
            return True

    def _make_room(self, nbytes: int) -> bool:
        if nbytes > self.max_bytes:
            return False
        while self.bytes + nbytes > self.max_bytes:
            victim = next((k for k, e in self._entries.items() if not e.owners), None)
            if victim is None:
                return False
            self.bytes -= self._entries.pop(victim).nbytes
            self.evictions += 1
        return True

    def release(self, owner: str) -> None:
        """Unpin everything `owner` pinned (request finished, aborted or failed)."""
        with self._lock:
            for entry in self._entries.values():
                entry.owners.pop(owner, None)

    def clear(self) -> None:
        with self._lock:
            self._entries = OrderedDict((k, e) for k, e in self._entries.items() if e.owners)
            self.bytes = sum(e.nbytes for e in self._entries.values())

    def stats(self) -> dict[str, float]:
        return {"hits": self.hits, "misses": self.misses, "evictions": self.evictions,
                "bytes": self.bytes, "max_bytes": self.max_bytes, "entries": len(self),
                "pinned_bytes": self.pinned_bytes, "hit_rate": self.hit_rate()}
