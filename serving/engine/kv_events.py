"""What the prefix cache gained and lost, for a router that routes by it: the block manager
records stored / removed / all-cleared events here; a publisher outside the engine core
(graft.serving.http.fleet.kv_events) takes them in batches on its own thread.

Recording is off until a publisher enables it, and never blocks the engine thread.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class BlockStored:
    """Consecutive full blocks of one prefix, now in the cache: block_hashes[0]'s parent is
    parent_hash (None: the prompt's first block); token_ids holds every block's tokens."""
    block_hashes: list[bytes]
    parent_hash: bytes | None
    token_ids: list[int] = field(default_factory=list)


@dataclass
class BlockRemoved:
    block_hashes: list[bytes]


@dataclass
class AllBlocksCleared:
    pass


class KVEventSink:
    """Events in the order the cache changed, until `take` hands them to the publisher.

    Only blocks announced as stored are announced as removed (an image block, held back
    from the router, leaves unannounced). Past `max_events` waiting, new events are dropped
    and counted in `dropped`: a router then misses some blocks, the engine never waits."""

    def __init__(self, max_events: int = 100_000):
        self.enabled = False
        self.max_events = max_events
        self.dropped = 0
        self._events: list = []
        self._announced: set[bytes] = set()
        self._cond = threading.Condition()

    def enable(self, max_events: int | None = None) -> None:
        if max_events is not None:
            self.max_events = max_events
        self.enabled = True

    def stored(self, parent: bytes | None, block_hash: bytes, token_ids) -> None:
        with self._cond:
            if block_hash in self._announced:  # (announced when scheduled)
                return
            last = self._events[-1] if self._events else None
            # a block continuing the previous event's chain joins it, as vLLM groups a
            # request's new blocks into one BlockStored
            if isinstance(last, BlockStored) and last.block_hashes[-1] == parent:
                last.block_hashes.append(block_hash)
                last.token_ids.extend(token_ids)
            elif not self._add(BlockStored([block_hash], parent, list(token_ids))):
                return
            self._announced.add(block_hash)

    def removed(self, block_hash: bytes) -> None:
        with self._cond:
            if block_hash not in self._announced:
                return
            self._announced.discard(block_hash)
            last = self._events[-1] if self._events else None
            if isinstance(last, BlockRemoved):
                last.block_hashes.append(block_hash)
            else:
                self._add(BlockRemoved([block_hash]))

    def cleared(self) -> None:
        with self._cond:
            self._announced.clear()
            self._add(AllBlocksCleared())

    def _add(self, event) -> bool:
        if len(self._events) >= self.max_events:
            self.dropped += 1
            return False
        self._events.append(event)
        self._cond.notify()
        return True

    def take(self, timeout: float | None = None) -> list:
        """Every waiting event (waiting up to `timeout` seconds for one); [] if none came."""
        with self._cond:
            if not self._events and timeout:
                self._cond.wait(timeout)
            events, self._events = self._events, []
            return events
