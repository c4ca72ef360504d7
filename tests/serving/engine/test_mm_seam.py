"""Image seams: spliced rows land at placeholder positions (also across prefill chunks) and
prefix-cache keys include the image content hash."""

import pytest
import torch

from graft.inject import IMAGE_PLACEHOLDER
from graft.serving import Engine, EngineConfig, ImageRange, MultiModalInputs, SamplingParams
from tests.serving.conftest import hf_greedy, make_prompts

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


def _image_request(engine, seed, offset=5, length=20, content_hash="img", lazy=False):
    """A prompt whose placeholder run is embedded with the rows of real tokens `image_ids`."""
    text = make_prompts((40,), seed=seed)[0]
    image_ids = text[offset:offset + length]
    rows = engine.runner.model.embed(torch.tensor(image_ids)).detach().clone()
    prompt = text[:offset] + [IMAGE_PLACEHOLDER] * length + text[offset + length:]
    embeds = (lambda: rows) if lazy else rows
    mm = MultiModalInputs([ImageRange(offset, length, content_hash, embeds)])
    return text, prompt, mm


@pytest.mark.parametrize("budget", [2048, 7])
def test_spliced_rows_equal_text_tokens(tiny_llama, budget):
    engine = Engine.from_pretrained(tiny_llama, EngineConfig(max_num_batched_tokens=budget))
    text, prompt, mm = _image_request(engine, seed=30, lazy=True)
    engine.add_request("img", prompt, GREEDY, mm_inputs=mm)
    final = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            final = out if out.finished else final
    assert final.token_ids == hf_greedy(tiny_llama, text, 8)


def test_image_hash_keys_prefix_cache(tiny_llama):
    engine = Engine.from_pretrained(tiny_llama, EngineConfig())

    def run(rid, content_hash):
        _, prompt, mm = _image_request(engine, seed=31, content_hash=content_hash)
        engine.add_request(rid, prompt, GREEDY, mm_inputs=mm)
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    return out

    first = run("a", "cat.png")
    same = run("b", "cat.png")
    other = run("c", "dog.png")
    # every prompt token but the last: full blocks, then the adopted tail block
    assert first.num_cached_tokens == 0 and same.num_cached_tokens == len(same.prompt_token_ids) - 1
    assert other.num_cached_tokens == 0  # block 0 holds image positions: a different key
    assert same.token_ids == first.token_ids


def test_bad_image_ranges_fail_the_request(tiny_llama):
    engine = Engine.from_pretrained(tiny_llama, EngineConfig())
    _, prompt, mm = _image_request(engine, seed=32)
    mm.ranges[0].offset += 1  # no longer on the placeholder run
    engine.add_request("bad", prompt, GREEDY, mm_inputs=mm)
    out = engine.step()[0]
    assert out.finish_reason == "error" and "IMAGE_PLACEHOLDER" in out.error
    wrong_rows = MultiModalInputs([ImageRange(5, 20, "x", torch.zeros(3, 64))])
    engine.add_request("rows", prompt, GREEDY, mm_inputs=wrong_rows)
    text = make_prompts((12,), seed=33)[0]
    engine.add_request("text", text, GREEDY)
    outs = {o.request_id: o for o in engine.step()}
    assert outs["rows"].finish_reason == "error" and "[20, d_model]" in outs["rows"].error
    assert "text" in outs  # the rest of the batch ran
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
