"""Multimodal requests through the engine: exact splicing across chunk cuts, parity with
the training-side GraftedModel, encoder-cache hit == miss, prefix cache keyed by images."""

import pytest
import torch
from PIL import Image

from graft.errors import GraftConfigError, GraftDataError
from graft.inject import IMAGE_PLACEHOLDER
from graft.serving import Engine, EngineConfig, ImageRange, MultiModalInputs, SamplingParams
from graft.serving.multimodal.front import generate_chats

RED = Image.new("RGB", (32, 32), (220, 20, 20))
BLUE = Image.new("RGB", (32, 32), (20, 20, 220))
ASK = [{"role": "user", "content": "<image>\nWhat color is it?"}]
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def _engine(run_dir, **cfg):
    base = dict(block_size=4, num_kv_blocks=96, max_num_batched_tokens=64)
    base.update(cfg)
    return Engine.from_pretrained(run_dir, EngineConfig(**base))


def _run(engine, requests):
    return generate_chats(engine, requests, GREEDY)


@pytest.fixture(scope="module")
def hf_model(tiny_run_dir):
    from graft.model import GraftedModel

    return GraftedModel.from_run(tiny_run_dir)


def _hf_tokens(hf_model, image):
    from graft.template import encode_chat

    n = hf_model.image_token_count(*image.size)
    chat = encode_chat(hf_model.tokenizer, ASK, [n], add_generation_prompt=True)
    ids = torch.tensor([chat.input_ids])
    embeds = hf_model.embed(ids, hf_model.image_features([image]))
    out = hf_model.llm.generate(inputs_embeds=embeds, attention_mask=torch.ones_like(ids),
                                max_new_tokens=GREEDY.max_tokens, do_sample=False,
                                min_new_tokens=GREEDY.max_tokens, temperature=None, top_p=None,
                                top_k=None, pad_token_id=hf_model.tokenizer.pad_token_id)
    return out[0].tolist()


@pytest.mark.parametrize("budget", [64, 5])  # 5: every image run is cut across prefill chunks
def test_engine_matches_grafted_model(tiny_run_dir, hf_model, budget):
    engine = _engine(tiny_run_dir, max_num_batched_tokens=budget)
    free0 = engine.stats().free_kv_blocks
    outs = _run(engine, {"red": (ASK, [RED]), "blue": (ASK, [BLUE])})
    assert outs["red"].token_ids == _hf_tokens(hf_model, RED)
    assert outs["blue"].token_ids == _hf_tokens(hf_model, BLUE)
    assert outs["red"].token_ids != outs["blue"].token_ids  # the image really steers decoding
    assert engine.stats().free_kv_blocks == free0 and engine.mm.cache.pinned_bytes == 0


def test_rows_for_slices_image_runs_at_chunk_cuts():
    rows_a = torch.arange(12.0).reshape(6, 2)
    rows_b = 100 + torch.arange(8.0).reshape(4, 2)
    mm = MultiModalInputs([ImageRange(10, 4, "b", rows_b), ImageRange(2, 6, "a", rows_a)])
    assert torch.equal(mm.rows_for(0, 5), rows_a[:3])  # chunk ends inside image a
    assert torch.equal(mm.rows_for(5, 12), torch.cat([rows_a[3:], rows_b[:2]]))
    assert mm.rows_for(8, 10) is None
    assert mm.extra_key(0, 4) == "a@2" and mm.extra_key(7, 11) == "a@2|b@10"


def test_placeholder_positions_hold_projector_rows(tiny_run_dir):
    engine = _engine(tiny_run_dir)
    ids, mm = engine.mm.prepare_chat(ASK, [RED], owner="x")
    (r,) = mm.ranges
    assert ids[r.offset:r.offset + r.length] == [IMAGE_PLACEHOLDER] * r.length
    assert ids.count(IMAGE_PLACEHOLDER) == r.length
    expected = engine.mm.image_path.image_features([RED])[0]
    assert torch.equal(r.get_embeds(), expected)
    engine.mm.cache.release("x")


def test_cache_hit_equals_miss_and_dedupes_a_batch(tiny_run_dir):
    engine = _engine(tiny_run_dir, enable_prefix_caching=False)
    cache = engine.mm.cache
    first = _run(engine, {"a": (ASK, [RED]), "b": (ASK, [RED])})  # same image twice, one batch
    assert engine.mm.encode_calls == 1 and cache.misses == 1 and len(cache) == 1
    again = _run(engine, {"c": (ASK, [RED])})
    assert engine.mm.encode_calls == 1 and cache.hits >= 1
    assert first["a"].token_ids == first["b"].token_ids == again["c"].token_ids
    assert cache.pinned_bytes == 0 and cache.bytes == len(cache) * 16 * 64 * 4


def test_prefix_cache_reuses_same_image_never_shares_different(tiny_run_dir):
    engine = _engine(tiny_run_dir)
    _run(engine, {"red1": (ASK, [RED])})
    same = _run(engine, {"red2": (ASK, [RED])})["red2"]
    other = _run(engine, {"blue": (ASK, [BLUE])})["blue"]
    ids, mm = engine.mm.prepare_chat(ASK, [RED], owner="probe")
    engine.mm.cache.release("probe")
    image_start = mm.ranges[0].offset
    assert same.num_cached_tokens > image_start  # KV reused past the image run's start
    # a different image shares only the blocks that end before the image starts
    assert other.num_cached_tokens <= image_start // 4 * 4


def test_image_bigger_than_cache_fails_clearly(tiny_run_dir):
    engine = Engine.from_pretrained(tiny_run_dir, EngineConfig(num_kv_blocks=32),
                                    cache_bytes=1024)  # 16 tokens x 64 x 4 B = 4096 B
    with pytest.raises(GraftDataError, match="encoder cache"):
        engine.mm.prepare_chat(ASK, [RED])
    assert engine.mm.cache.bytes == 0
    two = [{"role": "user", "content": "<image><image>\nSame?"}]
    engine.mm.cache.max_bytes = 6000  # one image fits, two different ones cannot be pinned
    ids, _ = engine.mm.prepare_chat(two, [RED, RED], owner="same")  # a repeat counts once
    engine.mm.cache.release("same")
    with pytest.raises(GraftDataError, match="together"):
        engine.mm.prepare_chat(two, [RED, BLUE])


def test_marker_count_mismatch(tiny_run_dir):
    engine = _engine(tiny_run_dir)
    with pytest.raises(GraftDataError, match="marker"):
        engine.mm.prepare_chat(ASK, [RED, BLUE])


def test_stream_chat_pieces_add_up_to_the_batch_answer(tiny_run_dir, tiny_llama):
    """graft chat's REPL on the engine: text per step, the same tokens as generate_chats,
    and a request interrupted midway is aborted at the engine (nothing left running)."""
    from graft.serving.multimodal.front import stream_chat

    engine = _engine(tiny_run_dir)
    whole = _run(engine, {"a": (ASK, [RED])})["a"]
    pieces = []
    out = stream_chat(engine, ASK, [RED], GREEDY, pieces.append)
    assert out.token_ids == whole.token_ids and "".join(pieces) == out.text == whole.text
    assert len(pieces) > 1  # more than one step's text: streamed, not handed over at the end

    def ctrl_c(piece):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        stream_chat(engine, ASK, [RED], GREEDY, ctrl_c)
    engine.step()  # the abort is reported at the next step
    assert not engine.has_unfinished_requests()
    assert engine.mm.cache.pinned_bytes == 0
    # a bare LLM engine: text only
    llm = Engine.from_pretrained(tiny_llama, EngineConfig(block_size=4, num_kv_blocks=96))
    text = [{"role": "user", "content": "hello"}]
    got = []
    assert stream_chat(llm, text, [], GREEDY, got.append).text == "".join(got)
    with pytest.raises(GraftConfigError, match="bare LLM dir"):
        stream_chat(llm, ASK, [RED], GREEDY, got.append)
