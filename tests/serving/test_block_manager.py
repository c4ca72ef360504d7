"""Block pool and prefix cache: chain hashes, verification, extra keys, LRU eviction."""

from graft.serving.block_manager import BlockManager, chain_hash
from graft.serving.sampling_params import SamplingParams
from graft.serving.sequence import Sequence


def _seq(tokens, rid="r"):
    return Sequence(rid, tokens, SamplingParams(), order=0)


def _run(bm, seq):
    """Allocate and 'compute' a whole sequence, registering its full blocks."""
    bm.acquire_prefix(seq, bm.lookup(seq))
    assert bm.append_slots(seq, seq.num_uncomputed)
    seq.num_computed_tokens = len(seq)
    bm.commit(seq)


def test_prefix_hit_and_release():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = _seq(list(range(10)))
    _run(bm, a)
    assert len(a.block_table) == 3 and bm.num_free_blocks == 5
    b = _seq(list(range(8)) + [99, 98, 97])
    hits = bm.lookup(b)
    assert hits == a.block_table[:2]  # two full shared blocks
    bm.free(a)
    assert bm.num_free_blocks == 8  # cached blocks count as free
    bm.acquire_prefix(b, hits)
    assert b.num_computed_tokens == 8 and bm.num_free_blocks == 6
    bm.free(b)
    assert bm.num_free_blocks == 8


def test_last_token_is_never_a_hit():
    bm = BlockManager(num_blocks=8, block_size=4)
    _run(bm, _seq(list(range(8))))
    assert len(bm.lookup(_seq(list(range(8))))) == 1  # the 2nd block holds the last token
    assert len(bm.lookup(_seq(list(range(9))))) == 2


def test_extra_key_separates_images():
    assert chain_hash(None, [1, 2], "img-a@0") != chain_hash(None, [1, 2], "img-b@0")
    assert chain_hash(None, [1, 2]) != chain_hash(chain_hash(None, [0]), [1, 2])


def test_hash_hit_is_verified():
    bm = BlockManager(num_blocks=4, block_size=2)
    a = _seq([1, 2, 3])
    _run(bm, a)
    key = a.block_hashes[0]
    bm.block_content[bm.cache[key]] = (None, (7, 7), None)  # simulate a colliding entry
    assert bm.lookup(_seq([1, 2, 3])) == []


def test_lru_eviction_prefers_uncached_then_oldest():
    bm = BlockManager(num_blocks=4, block_size=2)
    a, b = _seq([1, 2, 3], "a"), _seq([5, 6, 7], "b")
    _run(bm, a)
    _run(bm, b)
    bm.free(a)
    bm.free(b)
    assert bm.num_free_blocks == 4 and len(bm.evictable) == 2
    assert sorted(bm.free_block_ids) == [0, 1, 2, 3]
    c = _seq([9, 9, 9, 9, 9], "c")  # needs 3 blocks: 2 uncached, then evicts a's block
    _run(bm, c)
    assert bm.lookup(_seq([1, 2, 3])) == [] and len(bm.lookup(_seq([5, 6, 7]))) == 1
    bm.free(c)
    assert bm.num_free_blocks == 4


def test_disabled_cache_never_hits():
    bm = BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=False)
    _run(bm, _seq([1, 2, 3]))
    assert bm.lookup(_seq([1, 2, 3])) == [] and bm.cache == {}
