"""Several grafts over one engine: each answers as when served alone, requests of different
grafts share batches, text prefixes are shared across grafts, image KV never is."""

import pytest
from PIL import Image

from graft.inject import IMAGE_PLACEHOLDER
from graft.serving import Engine, EngineConfig, SamplingParams
from graft.serving.multimodal.front import generate_chats

RED = Image.new("RGB", (32, 32), (220, 20, 20))
BLUE = Image.new("RGB", (32, 32), (20, 20, 220))
ASK = [{"role": "user", "content": "<image>\nWhat color is it?"}]
TEXT = [{"role": "user", "content": "Describe the picture in one sentence. Please describe "
                                    "the scene, left right top bottom center."}]
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
CFG = dict(block_size=4, num_kv_blocks=128, max_num_batched_tokens=256)


def _run(engine, requests):
    """requests: {rid: (graft, messages, images)}, all queued at once -> ({rid: output},
    [set of grafts per step])."""
    steps = []
    execute = engine.runner.execute

    def recording(batch):
        steps.append({requests[s.request_id][0] for s in batch.seqs})
        return execute(batch)

    engine.runner.execute = recording
    several = engine.mm is None  # else one run dir served alone: its default graft
    done = generate_chats(engine, {rid: (messages, images, graft) if several else (messages, images)
                                   for rid, (graft, messages, images) in requests.items()}, GREEDY)
    engine.runner.execute = execute
    return done, steps


@pytest.fixture(scope="module")
def multi(graft_runs):
    return Engine.from_grafts(graft_runs, EngineConfig(**CFG))


def test_each_graft_answers_as_alone_in_mixed_batches(graft_runs, multi):
    requests = {"sig-red": ("sig", ASK, [RED]), "clip-red": ("clip", ASK, [RED]),
                "sig2-blue": ("sig2", ASK, [BLUE]), "clip-text": ("clip", TEXT, []),
                "sig-blue": ("sig", ASK, [BLUE])}
    free0 = multi.stats().free_kv_blocks
    together, steps = _run(multi, requests)
    assert any(len(graft_set) == 3 for graft_set in steps)  # one batch, three grafts
    for name, run_dir in graft_runs.items():
        alone = Engine.from_pretrained(run_dir, EngineConfig(**CFG))
        mine = {rid: r for rid, r in requests.items() if r[0] == name}
        outs, _ = _run(alone, mine)
        for rid in mine:
            assert together[rid].token_ids == outs[rid].token_ids, rid
    # the graft really matters: the same image answers differently through another projector
    assert together["sig-red"].token_ids != together["clip-red"].token_ids
    assert multi.stats().free_kv_blocks == free0 and multi.grafts.cache.pinned_bytes == 0


def test_one_llm_and_a_shared_encoder_loaded_once(multi):
    grafts = multi.grafts
    assert multi.mm is None and all(not hasattr(grafts[n], "llm") for n in grafts)
    assert grafts["sig"].image_path.encoder is grafts["sig2"].image_path.encoder
    assert grafts["sig"].image_path.encoder is not grafts["clip"].image_path.encoder
    assert len(grafts.encoders()) == 2
    assert all(grafts[n].cache is grafts.cache for n in grafts)  # one byte budget
    assert grafts["sig"].adapter_id != grafts["sig2"].adapter_id


def test_text_prefix_is_shared_across_grafts(multi):
    first, _ = _run(multi, {"t1": ("sig", TEXT, [])})
    second, _ = _run(multi, {"t2": ("clip", TEXT, [])})
    n_prompt = len(second["t2"].prompt_token_ids)
    assert first["t1"].token_ids == second["t2"].token_ids
    # every full block but the one holding the last prompt token comes from graft sig's KV
    assert second["t2"].num_cached_tokens == (n_prompt - 1) // 4 * 4 > 0


def test_same_image_never_reuses_another_grafts_kv(multi):
    ask = [{"role": "user", "content": "<image>\nWhat color is it? Describe the picture."}]
    green = Image.new("RGB", (32, 32), (20, 200, 20))
    run = lambda rid, g: _run(multi, {rid: (g, ask, [green])})[0][rid]
    ids = run("g-sig", "sig").prompt_token_ids
    image_at = ids.index(IMAGE_PLACEHOLDER)
    misses = {n: multi.grafts[n].misses for n in multi.grafts}
    for other in ("sig2", "clip"):  # same encoder + other projector; other encoder
        out = run(f"g-{other}", other)
        assert out.num_cached_tokens <= image_at  # at most the text before the image
        assert multi.grafts[other].misses == misses[other] + 1  # its own embeddings
    again = run("g-sig-again", "sig")
    assert again.num_cached_tokens > image_at + 16  # its own image blocks do hit


def test_speculation_in_mixed_graft_batches_is_lossless_with_a_table_per_graft(graft_runs, multi):
    """Suffix decoding over several grafts: the same greedy tokens as without speculation,
    and each graft's outputs feed only its own suffix table."""
    requests = {"sig-red": ("sig", ASK, [RED]), "clip-red": ("clip", ASK, [RED]),
                "clip-text": ("clip", TEXT, []), "sig2-blue": ("sig2", ASK, [BLUE])}
    want, _ = _run(multi, requests)
    spec = Engine.from_grafts(graft_runs, EngineConfig(**CFG, speculative="suffix",
                                                       enable_prefix_caching=False))
    for _ in range(2):  # the second pass can draw on the first pass's outputs
        got, steps = _run(spec, requests)
        assert {rid: o.token_ids for rid, o in got.items()} == \
            {rid: o.token_ids for rid, o in want.items()}
    assert any(len(graft_set) >= 2 for graft_set in steps)
    assert set(spec.spec.suffixes) == {"sig", "clip", "sig2"}
    for name, table in spec.spec.suffixes.items():
        outputs = [got[rid].token_ids for rid, r in requests.items() if r[0] == name]
        others = [got[rid].token_ids for rid, r in requests.items() if r[0] != name]
        mine = {tuple(o[i:i + 2]) for o in outputs for i in range(len(o) - 1)}
        theirs = {tuple(o[i:i + 2]) for o in others for i in range(len(o) - 1)} - mine
        keys = {k for k in table.next if len(k) == 2}
        assert keys & mine and not keys & theirs
    assert spec.stats().free_kv_blocks == CFG["num_kv_blocks"]
