"""Paged KV block pool: ref counts, free list, and a prefix cache keyed by chain hashes.

A full block's key is hash(parent key, its token ids, extra key), so a hit means the whole
prefix matches. Hits are verified against the stored tokens and parent; blocks nobody
references stay cached and are evicted least recently freed first.

The partly filled last block of a finished sequence is kept too (a "tail", filed under its
parent's key): a new prompt that continues the same prefix adopts it (the block changes
owner, nothing is copied) and skips those tokens, so a repeated request recomputes one token
instead of up to a block.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque

from graft.serving.engine.kv_events import KVEventSink
from graft.serving.engine.sequence import Sequence

MAX_TAILS_PER_PARENT = 8  # bounds the scan in lookup_tail; the oldest extra tail is dropped


def chain_hash(parent: bytes | None, token_ids: list[int], extra_key: str | None = None) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    h.update(parent or b"root")
    h.update(array("q", token_ids).tobytes())
    if extra_key is not None:
        h.update(b"\x00extra:" + extra_key.encode())
    return h.digest()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        # what a cached block holds, to verify a hash hit: (parent key, token ids, extra key)
        self.block_key: list[bytes | None] = [None] * num_blocks
        self.block_content: list[tuple | None] = [None] * num_blocks
        self.free_ids: deque[int] = deque(range(num_blocks))  # never cached, or invalidated
        self.evictable: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced, LRU first
        self.cache: dict[bytes, int] = {}  # chain hash -> block id
        # tails: parent chain hash (None: first block) -> block ids, oldest first; and per
        # tail block (parent, token ids, images touching its tokens)
        self.tails: dict[bytes | None, list[int]] = {}
        self.tail_content: dict[int, tuple] = {}
        self.hit_tokens = 0  # prefix-cache statistics
        self.query_tokens = 0
        self.events = KVEventSink()  # off until a KV-event publisher enables it
        self._planned: set[bytes] = set()  # announced when scheduled, registered after the step

    # --- capacity -------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence references (including cached ones that may be evicted)."""
        return len(self.free_ids) + len(self.evictable)

    @property
    def free_block_ids(self) -> list[int]:
        """Ids of the unreferenced blocks, never-cached first, then cached in eviction order."""
        return list(self.free_ids) + list(self.evictable)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # --- prefix cache ---------------------------------------------------------------
    def lookup(self, seq: Sequence) -> list[int]:
        """Cached blocks matching seq's leading full blocks; never the last token's block.

        At least one token stays uncomputed so the step that finishes the prompt has logits.
        """
        if not self.enable_prefix_caching:
            return []
        bs = self.block_size
        hits: list[int] = []
        parent = None
        for i in range((len(seq) - 1) // bs):
            tokens = seq.token_ids[i * bs:(i + 1) * bs]
            extra = seq.block_extra_key(i, bs)
            key = chain_hash(parent, tokens, extra)
            bid = self.cache.get(key)
            if bid is None or self.block_content[bid] != (parent, tuple(tokens), extra):
                break
            hits.append(bid)
            parent = key
        return hits

    def lookup_tail(self, seq: Sequence, hits: list[int]) -> tuple[int, int] | None:
        """(tail block, tokens it covers) continuing seq after the full blocks `hits`: the
        longest match that leaves seq's last token uncomputed; None if there is none."""
        if not self.enable_prefix_caching:
            return None
        parent = self.block_key[hits[-1]] if hits else None
        start = len(hits) * self.block_size
        want = seq.token_ids[start:len(seq) - 1]
        best = None
        for bid in self.tails.get(parent, ()):
            _, tokens, images = self.tail_content[bid]
            k = 0
            for a, b in zip(tokens, want):
                if a != b:
                    break
                k += 1
            if k and (best is None or k > best[1]) and images_in(images, start, start + k) == \
                    _images(seq, start, start + k):
                best = (bid, k)
        return best

    def num_reclaimed(self, hits: list[int], tail: tuple[int, int] | None = None) -> int:
        """How many of `hits` (and the tail) would leave the free pool when acquired."""
        return sum(1 for b in hits if self.ref_counts[b] == 0) + (tail is not None)

    def acquire_prefix(self, seq: Sequence, hits: list[int],
                       tail: tuple[int, int] | None = None) -> None:
        """Give a fresh sequence the cached blocks `hits` (from lookup) as its first blocks,
        then the adopted tail (from lookup_tail) if any."""
        for bid in hits:
            if self.ref_counts[bid] == 0:
                self.evictable.pop(bid, None)
            self.ref_counts[bid] += 1
            seq.block_table.append(bid)
            seq.block_hashes.append(self.block_key[bid])
        seq.num_computed_tokens = len(hits) * self.block_size
        if tail is not None:
            bid, k = tail
            self._drop_tail(bid)  # the block now belongs to seq, which writes past k
            self.ref_counts[bid] = 1
            seq.block_table.append(bid)
            seq.num_computed_tokens += k
        seq.num_cached_tokens = seq.num_computed_tokens
        if self.enable_prefix_caching:
            self.query_tokens += len(seq)
            self.hit_tokens += seq.num_computed_tokens

    # --- pins (a prompt's KV held for another engine: kv_transfer.KVExports) -------------
    def pin(self, block_ids: list[int]) -> None:
        """One more reference on each block (held by something other than a sequence)."""
        for bid in block_ids:
            if self.ref_counts[bid] == 0:
                self.evictable.pop(bid, None)
            self.ref_counts[bid] += 1

    def unpin(self, block_ids: list[int]) -> None:
        for bid in block_ids:
            self._unref(bid)

    # --- allocation -----------------------------------------------------------------
    def new_blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        need = self.blocks_for(seq.num_computed_tokens + num_new_tokens)
        return max(0, need - len(seq.block_table))

    def append_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Grow seq's block table to hold num_new_tokens more; False (no change) if full."""
        need = self.new_blocks_needed(seq, num_new_tokens)
        if need > self.num_free_blocks:
            return False
        for _ in range(need):
            seq.block_table.append(self._take_block())
        return True

    def rollback(self, seq: Sequence) -> None:
        """Release the blocks past seq's computed tokens: after a verify step they hold only
        rejected proposals. Called before commit, so no block with a rejected token is ever
        registered; a kept, partly valid tail block is overwritten by the next tokens."""
        keep = self.blocks_for(seq.num_computed_tokens)
        for bid in reversed(seq.block_table[keep:]):
            self._unref(bid)
        del seq.block_table[keep:]

    def _unref(self, bid: int, keep: bool = False) -> None:
        """Drop one reference; an unreferenced block stays cached (evictable) if it is
        registered or `keep`, else it is plain free."""
        self.ref_counts[bid] -= 1
        if self.ref_counts[bid] == 0:
            if self.block_key[bid] is not None or keep:
                self.evictable[bid] = None
                self.evictable.move_to_end(bid)
            else:
                self.free_ids.append(bid)

    def _take_block(self) -> int:
        if self.free_ids:
            bid = self.free_ids.popleft()
        else:
            bid, _ = self.evictable.popitem(last=False)
            if bid in self.tail_content:
                self._drop_tail(bid)
            key = self.block_key[bid]
            if self.cache.get(key) == bid:
                del self.cache[key]
                if self.events.enabled:
                    self.events.removed(key)
            self.block_key[bid] = None
            self.block_content[bid] = None
        self.ref_counts[bid] = 1
        return bid

    def commit(self, seq: Sequence) -> None:
        """Register seq's newly completed full blocks in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        full = seq.num_computed_tokens // bs
        announce = _text_blocks(seq, bs) if self.events.enabled else 0
        for i in range(len(seq.block_hashes), full):
            parent = seq.block_hashes[-1] if seq.block_hashes else None
            tokens = seq.token_ids[i * bs:(i + 1) * bs]
            extra = seq.block_extra_key(i, bs)
            key = chain_hash(parent, tokens, extra)
            seq.block_hashes.append(key)
            bid = seq.block_table[i]
            if key not in self.cache and self.block_key[bid] is None:
                self.cache[key] = bid
                self.block_key[bid] = key
                self.block_content[bid] = (parent, tuple(tokens), extra)
                if i < announce:
                    self.events.stored(parent, key, tokens)

    def announce_scheduled(self, batch) -> None:
        """Announce the full prompt blocks a step is about to compute (`batch`: the
        scheduler's), as vLLM announces blocks once they are scheduled: a router hears of a
        prompt a step sooner. A block announced so that the step then did not register (its
        request failed) is announced as removed at the next step."""
        for key in self._planned - self.cache.keys():
            self.events.removed(key)
        self._planned = set()
        bs = self.block_size
        for seq, n in zip(batch.seqs, batch.num_tokens):
            end = min(min(seq.num_computed_tokens + n, seq.num_prompt_tokens) // bs,
                      _text_blocks(seq, bs))
            parent = seq.block_hashes[-1] if seq.block_hashes else None
            for i in range(len(seq.block_hashes), end):
                tokens = seq.token_ids[i * bs:(i + 1) * bs]
                key = chain_hash(parent, tokens)  # (a text block has no extra key)
                if key not in self.cache:
                    self.events.stored(parent, key, tokens)
                    self._planned.add(key)
                parent = key

    def free(self, seq: Sequence) -> None:
        """Drop seq's references; tail blocks first so LRU evicts a prefix's end first."""
        tail = self._tail_block(seq)
        for bid in reversed(seq.block_table):
            if bid == tail and self.ref_counts[bid] == 1:
                self._add_tail(seq, bid)
            self._unref(bid, keep=bid == tail)
        seq.block_table = []
        seq.block_hashes = []
        seq.num_computed_tokens = 0

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block and tail (as vLLM's reset_prefix_cache); False, changing
        nothing, while a sequence or a pin still holds a block."""
        if any(self.ref_counts):
            return False
        self.free_ids = deque(range(self.num_blocks))
        self.evictable.clear()
        self.cache.clear()
        self.tails.clear()
        self.tail_content.clear()
        self.block_key = [None] * self.num_blocks
        self.block_content = [None] * self.num_blocks
        self._planned = set()
        if self.events.enabled:
            self.events.cleared()
        return True

    # --- tails (partly filled last blocks) --------------------------------------------
    def _tail_block(self, seq: Sequence) -> int | None:
        """seq's partly computed block after its registered full blocks, if worth keeping."""
        if not self.enable_prefix_caching:
            return None
        full = seq.num_computed_tokens // self.block_size
        if (seq.num_computed_tokens % self.block_size == 0 or len(seq.block_table) <= full
                or len(seq.block_hashes) != full):
            return None
        bid = seq.block_table[full]
        return bid if self.block_key[bid] is None else None

    def _add_tail(self, seq: Sequence, bid: int) -> None:
        full = seq.num_computed_tokens // self.block_size
        parent = seq.block_hashes[-1] if full else None
        start, end = full * self.block_size, seq.num_computed_tokens
        self.tail_content[bid] = (parent, tuple(seq.token_ids[start:end]), _images(seq, start, end))
        siblings = self.tails.setdefault(parent, [])
        siblings.append(bid)
        if len(siblings) > MAX_TAILS_PER_PARENT:
            old = siblings[0]
            self._drop_tail(old)
            self.evictable.pop(old, None)
            self.free_ids.append(old)

    def _drop_tail(self, bid: int) -> None:
        parent = self.tail_content.pop(bid)[0]
        siblings = self.tails[parent]
        siblings.remove(bid)
        if not siblings:
            del self.tails[parent]
        self.evictable.pop(bid, None)


def _text_blocks(seq: Sequence, block_size: int) -> float:
    """How many of seq's leading blocks hold no image token (all of them: inf). A router
    matches blocks by token ids alone, so blocks from the first image on are not announced:
    any image of the same size would match them."""
    ranges = seq.mm_inputs.ranges if seq.mm_inputs is not None else ()
    return min(r.offset for r in ranges) // block_size if ranges else float("inf")


def _images(seq: Sequence, start: int, end: int) -> tuple:
    """(content hash, offset, length) of seq's images touching positions [start, end)."""
    if seq.mm_inputs is None:
        return ()
    return tuple((r.content_hash, r.offset, r.length) for r in seq.mm_inputs.overlapping(start, end))


def images_in(images: tuple, start: int, end: int) -> tuple:
    """The entries of an _images() tuple that touch [start, end)."""
    return tuple(im for im in images if im[1] < end and start < im[1] + im[2])
