"""Block pool and prefix cache: chain hashes, verification, extra keys, LRU eviction."""

from graft.serving.engine.block_manager import MAX_TAILS_PER_PARENT, BlockManager, chain_hash
from graft.serving.engine.mm_inputs import ImageRange, MultiModalInputs
from graft.serving.engine.sampling_params import SamplingParams
from graft.serving.engine.sequence import Sequence


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
    # each keeps its full block and its partly filled tail block, tails evicted first
    assert bm.num_free_blocks == 4 and len(bm.evictable) == 4 and len(bm.tail_content) == 2
    assert sorted(bm.free_block_ids) == [0, 1, 2, 3]
    c = _seq([9, 9, 9, 9, 9], "c")  # needs 3 blocks: a's tail, a's block, b's tail
    _run(bm, c)
    assert bm.lookup(_seq([1, 2, 3])) == [] and len(bm.lookup(_seq([5, 6, 7]))) == 1
    assert bm.tails == {} and bm.tail_content == {}  # evicted tails leave the registry
    bm.free(c)
    assert bm.num_free_blocks == 4


def test_disabled_cache_never_hits():
    bm = BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=False)
    _run(bm, _seq([1, 2, 3]))
    assert bm.lookup(_seq([1, 2, 3])) == [] and bm.cache == {}


def test_repeat_adopts_the_tail_block():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = _seq(list(range(10)), "a")
    _run(bm, a)
    tail_block = a.block_table[2]  # holds tokens 8, 9
    bm.free(a)
    b = _seq(list(range(10)), "b")
    hits = bm.lookup(b)
    assert bm.lookup_tail(b, hits) == (tail_block, 1)  # token 9 stays uncomputed (logits)
    bm.acquire_prefix(b, hits, bm.lookup_tail(b, hits))
    assert b.block_table[2] == tail_block and b.num_computed_tokens == 9 == b.num_cached_tokens
    assert tail_block not in bm.evictable and bm.tails == {}  # adopted: owned by b now
    assert bm.append_slots(b, 1) and len(b.block_table) == 3
    b.num_computed_tokens = 10
    bm.commit(b)
    bm.free(b)
    assert bm.num_free_blocks == 8
    # a longer tail serves any prompt that shares a prefix of it, never the last token
    c = _seq(list(range(8)) + [8, 77, 78], "c")
    assert bm.lookup_tail(c, bm.lookup(c)) == (tail_block, 1)
    assert bm.lookup_tail(_seq(list(range(9)), "d"), bm.lookup(_seq(list(range(9))))) is None
    assert bm.lookup_tail(_seq(list(range(8)) + [5, 9], "e"), bm.lookup(c)) is None


def _image_seq(tokens, image_hash, rid):
    seq = _seq(tokens, rid)
    seq.mm_inputs = MultiModalInputs([ImageRange(2, 3, image_hash, None)])
    return seq


def test_tail_with_a_different_image_is_not_adopted():
    bm = BlockManager(num_blocks=8, block_size=4)
    tokens = [1, 2, -200, -200, -200, 7, 8]  # the image spans the first block and the tail
    first = _image_seq(tokens, "img-a", "a")
    _run(bm, first)
    bm.free(first)
    same, other = _image_seq(tokens, "img-a", "s"), _image_seq(tokens, "img-b", "o")
    assert bm.lookup(other) == [] and bm.lookup_tail(other, []) is None
    hits = bm.lookup(same)
    assert len(hits) == 1 and bm.lookup_tail(same, hits)[1] == 2


def test_tails_per_prefix_are_bounded():
    bm = BlockManager(num_blocks=2 * MAX_TAILS_PER_PARENT + 4, block_size=4)
    for i in range(MAX_TAILS_PER_PARENT + 2):
        seq = _seq([1, 2, 3, 4, 5, 6 + i], f"r{i}")
        _run(bm, seq)
        bm.free(seq)
    assert len(bm.tail_content) == MAX_TAILS_PER_PARENT == len(next(iter(bm.tails.values())))
    assert bm.num_free_blocks == bm.num_blocks
