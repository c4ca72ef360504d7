"""KV events the block manager records: stored blocks with their parent and tokens from a real
engine run, removals on eviction, all-cleared on a reset, nothing for image blocks."""

from graft.serving import Engine, EngineConfig
from graft.serving.engine.block_manager import BlockManager, chain_hash
from graft.serving.engine.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventSink
from graft.serving.engine.mm_inputs import ImageRange, MultiModalInputs
from graft.serving.engine.sampling_params import SamplingParams
from graft.serving.engine.sequence import Sequence

GREEDY = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)


def _stored_blocks(events):
    """[(parent, hash, tokens)] of every BlockStored, one entry per block."""
    out = []
    for e in events:
        if isinstance(e, BlockStored):
            size = len(e.token_ids) // len(e.block_hashes)
            parent = e.parent_hash
            for i, h in enumerate(e.block_hashes):
                out.append((parent, h, e.token_ids[i * size:(i + 1) * size]))
                parent = h
    return out


def test_engine_run_records_prefix_blocks_then_evictions_then_clear(tiny_llama):
    engine = Engine.from_pretrained(tiny_llama, EngineConfig(block_size=4, num_kv_blocks=12))
    events = engine.block_manager.events
    engine.generate(prompt_token_ids=[list(range(1, 12))], sampling_params=GREEDY)
    assert events.take() == []  # off by default: nothing recorded
    events.enable()
    shared = list(range(20, 29))  # two full blocks, then a different tail
    out = engine.generate(prompt_token_ids=[shared + [40, 41, 42], shared + [50, 51, 52]],
                          sampling_params=GREEDY)
    blocks = _stored_blocks(events.take())
    first = out[0].prompt_token_ids + out[0].token_ids
    # the chain of the first request's full blocks, as the prefix cache keys them
    parent, expect = None, []
    for i in range(len(first) // 4):
        key = chain_hash(parent, first[i * 4:(i + 1) * 4])
        expect.append((parent, key, first[i * 4:(i + 1) * 4]))
        parent = key
    assert blocks[:len(expect)] == expect
    # the second request shares the two leading blocks: stored once, its own blocks chain on
    second = [b for b in blocks[len(expect):]]
    assert second[0][0] == expect[1][1] and second[0][2] == [28, 50, 51, 52]
    assert len({h for _, h, _ in blocks}) == len(blocks)

    # a pool of 12 blocks: new prompts evict cached blocks, each removal announced once
    engine.generate(prompt_token_ids=[list(range(100 + 13 * k, 112 + 13 * k)) for k in range(3)],
                    sampling_params=GREEDY)
    later = events.take()
    removed = [h for e in later if isinstance(e, BlockRemoved) for h in e.block_hashes]
    assert removed and set(removed) <= {h for _, h, _ in blocks}
    assert len(removed) == len(set(removed))
    assert all(h not in engine.block_manager.cache for h in removed)

    assert engine.block_manager.reset_prefix_cache()
    assert isinstance(events.take()[-1], AllBlocksCleared)
    assert engine.block_manager.cache == {}


def test_reset_is_refused_while_a_block_is_held():
    bm = BlockManager(num_blocks=4, block_size=2)
    bm.events.enable()
    seq = Sequence("r", [1, 2, 3], SamplingParams(), order=0)
    assert bm.append_slots(seq, 3)
    seq.num_computed_tokens = 3
    bm.commit(seq)
    assert not bm.reset_prefix_cache() and bm.cache  # nothing changed, no event
    assert not any(isinstance(e, AllBlocksCleared) for e in bm.events.take())


def test_blocks_from_the_first_image_on_are_not_announced():
    bm = BlockManager(num_blocks=8, block_size=2)
    bm.events.enable()
    seq = Sequence("r", [1, 2, 3, 4, -1, -1, 7, 8, 9], SamplingParams(), order=0)
    seq.mm_inputs = MultiModalInputs([ImageRange(4, 2, "img", None)])
    assert bm.append_slots(seq, len(seq))
    seq.num_computed_tokens = len(seq)
    bm.commit(seq)
    assert len(seq.block_hashes) == 4  # all four full blocks are cached ...
    blocks = _stored_blocks(bm.events.take())
    assert [tokens for _, _, tokens in blocks] == [[1, 2], [3, 4]]  # ... two announced
    for bid in seq.block_table:  # evicting the image blocks announces nothing about them
        bm._unref(bid)
    while bm.cache:
        bm._take_block()
    removed = [h for e in bm.events.take() for h in e.block_hashes]
    assert sorted(removed) == sorted(h for _, h, _ in blocks)


def test_sink_bounds_what_waits_and_counts_drops():
    sink = KVEventSink(max_events=2)
    sink.enable()
    sink.stored(None, b"a", [1])
    sink.stored(b"a", b"b", [2])  # continues the chain: the same event
    sink.stored(None, b"c", [3])
    sink.stored(None, b"d", [4])  # a third event: dropped
    assert sink.dropped == 1
    got = sink.take()
    assert got == [BlockStored([b"a", b"b"], None, [1, 2]), BlockStored([b"c"], None, [3])]
    sink.removed(b"d")  # never announced (dropped): not announced as removed either
    assert sink.take() == []


def test_prompt_blocks_are_announced_when_scheduled_and_withdrawn_if_never_computed():
    from graft.serving.engine.scheduler import ScheduledBatch

    bm = BlockManager(num_blocks=8, block_size=2)
    bm.events.enable()
    seq = Sequence("r", [1, 2, 3, 4, 5], SamplingParams(), order=0)
    assert bm.append_slots(seq, 5)
    bm.announce_scheduled(ScheduledBatch([seq], [5], 0))  # before the step computes anything
    blocks = _stored_blocks(bm.events.take())
    assert [tokens for _, _, tokens in blocks] == [[1, 2], [3, 4]]
    assert blocks[0][1] == chain_hash(None, [1, 2]) and blocks[1][0] == blocks[0][1]
    seq.num_computed_tokens = 5
    bm.commit(seq)  # the step ran: registered, and not announced twice
    assert bm.events.take() == []

    other = Sequence("s", [7, 8, 9], SamplingParams(), order=1)
    assert bm.append_slots(other, 3)
    bm.announce_scheduled(ScheduledBatch([other], [3], 0))
    planned = [h for _, h, _ in _stored_blocks(bm.events.take())]
    bm.free(other)  # its step failed: nothing was registered
    bm.announce_scheduled(ScheduledBatch([], [], 0))  # the next step withdraws it
    assert bm.events.take() == [BlockRemoved(planned)]
    assert chain_hash(None, [1, 2]) in bm.cache  # the computed request's blocks stay
