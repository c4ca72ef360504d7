"""Prefill/decode split at the engine: one engine prefills and holds the prompt's KV, another
takes it and decodes without computing the prompt; tokens equal HF's, no block leaks."""

import dataclasses

import pytest
import torch

from graft.serving import Engine, EngineConfig, SamplingParams
from graft.serving.engine.kv_transfer import decode_payload, encode_payload, importable_tokens
from tests.serving.conftest import hf_greedy, make_prompts

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)
PREFILL = SamplingParams(temperature=0.0, max_tokens=1)


def _run(engine):
    outs = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                outs[o.request_id] = o
    return outs


def _prefill(engine, rid, prompt):
    engine.add_request(rid, prompt_token_ids=prompt, sampling_params=PREFILL, kv_export=True)
    _run(engine)
    return decode_payload(encode_payload(engine.kv_exports.take(engine.runner, rid)))


def _computed_per_step(engine):
    seen, schedule = [], engine.scheduler.schedule

    def recording(*args, **kwargs):
        batch, finished = schedule(*args, **kwargs)
        seen.append(list(batch.num_tokens))
        return batch, finished

    engine.scheduler.schedule = recording
    return seen


@pytest.fixture(scope="module")
def pair(tiny_llama):
    # other block sizes on the two sides: the payload is token-major
    return (Engine.from_pretrained(tiny_llama, EngineConfig(block_size=16)),
            Engine.from_pretrained(tiny_llama, EngineConfig(block_size=8)))


@pytest.mark.parametrize("length", [2, 17, 40, 64])
def test_decode_from_transferred_kv_equals_hf_and_computes_one_token(pair, tiny_llama, length):
    prefill, decode = pair
    prompt = make_prompts([length], seed=length)[0]
    payload = _prefill(prefill, "p", prompt)
    assert payload.token_ids == prompt and payload.kv.shape[2] == length
    steps = _computed_per_step(decode)
    decode.add_request("d", prompt_token_ids=prompt, sampling_params=GREEDY, kv_import=payload)
    out = _run(decode)["d"]
    assert out.token_ids == hf_greedy(tiny_llama, prompt, GREEDY.max_tokens)
    assert out.num_cached_tokens == length - 1  # the last token's logits are computed here
    assert steps[0] == [1]
    for engine in pair:  # nothing pinned or leaked on either side
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
        assert not engine.kv_exports.held


def test_a_different_prompt_imports_only_the_common_prefix(pair, tiny_llama):
    prefill, decode = pair
    prompt = make_prompts([40], seed=7)[0]
    payload = _prefill(prefill, "p2", prompt)
    other = prompt[:20] + [(t + 1) % 100 for t in prompt[20:]]
    decode.add_request("d2", prompt_token_ids=other, sampling_params=GREEDY, kv_import=payload)
    out = _run(decode)["d2"]
    assert out.num_cached_tokens == 20
    assert out.token_ids == hf_greedy(tiny_llama, other, GREEDY.max_tokens)


def test_a_payload_from_another_model_is_refused_and_the_prompt_prefilled(pair, tiny_llama):
    prefill, decode = pair
    prompt = make_prompts([30], seed=8)[0]
    payload = _prefill(prefill, "p3", prompt)
    payload = dataclasses.replace(payload, layout={**payload.layout, "head_dim": 3})
    before = decode.kv_exports.stats.failure_reasons.get("layout", 0)
    decode.add_request("d3", prompt_token_ids=prompt, sampling_params=GREEDY, kv_import=payload)
    out = _run(decode)["d3"]
    assert out.num_cached_tokens == 0
    assert out.token_ids == hf_greedy(tiny_llama, prompt, GREEDY.max_tokens)
    assert decode.kv_exports.stats.failure_reasons["layout"] == before + 1


def test_prompt_logprobs_prefill_here_instead_of_importing(pair, tiny_llama):
    """Transferred KV has no logits: a request that scores its prompt computes all of it."""
    from tests.serving.engine.test_prompt_logprobs import check

    prefill, decode = pair
    prompt = make_prompts([30], seed=9)[0]
    payload = _prefill(prefill, "p6", prompt)
    decode.add_request("d6", prompt_token_ids=prompt, kv_import=payload, sampling_params=
                       dataclasses.replace(GREEDY, prompt_logprobs=2))
    out = _run(decode)["d6"]
    assert out.num_cached_tokens == 0 and out.num_transferred_tokens == 0
    check(tiny_llama, prompt, out.prompt_logprobs, 2)
    assert out.token_ids == hf_greedy(tiny_llama, prompt, GREEDY.max_tokens)
    assert decode.block_manager.num_free_blocks == decode.block_manager.num_blocks


def test_an_unclaimed_export_is_freed_after_its_ttl(pair):
    prefill, _ = pair
    prefill.add_request("p4", prompt_token_ids=make_prompts([50], seed=9)[0],
                        sampling_params=PREFILL, kv_export=True)
    _run(prefill)
    bm = prefill.block_manager
    assert bm.num_free_blocks == bm.num_blocks - 4  # 50 tokens in blocks of 16, pinned
    assert prefill.kv_exports.expire(now=float("inf")) == 1
    assert bm.num_free_blocks == bm.num_blocks
    assert prefill.kv_exports.take(prefill.runner, "p4") is None


def test_unclaimed_exports_give_way_to_this_engines_requests_after_a_grace(tiny_llama):
    """Exports nobody pulls (a client sending do_remote_decode, a router gone) can fill the
    pool; past EXPORT_GRACE_S they are freed, oldest first, for the requests waiting here."""
    from graft.serving.engine.kv_transfer import EXPORT_GRACE_S

    engine = Engine.from_pretrained(tiny_llama, EngineConfig(block_size=8, num_kv_blocks=24))
    exports, bm = engine.kv_exports, engine.block_manager
    for i, seed in enumerate((20, 21)):  # 2 x 10 of the 24 blocks pinned
        engine.add_request(f"x{i}", prompt_token_ids=make_prompts([80], seed=seed)[0],
                           sampling_params=PREFILL, kv_export=True)
        _run(engine)
    assert len(exports.held) == 2 and bm.num_free_blocks == 4
    prompt = make_prompts([60], seed=22)[0]  # 8 blocks, and 1 more to decode into
    engine.add_request("r", prompt_token_ids=prompt, sampling_params=GREEDY)
    assert exports.make_room(engine.scheduler.blocks_wanted()) == 0  # within the grace
    held_at = exports.held["x0"].expires - exports.ttl_s
    assert exports.make_room(engine.scheduler.blocks_wanted(),
                             now=held_at + EXPORT_GRACE_S + 1) == 1
    assert list(exports.held) == ["x1"] and exports.stats.export_evicted == 1
    for export in exports.held.values():  # the engine's own steps do the same
        export.expires -= EXPORT_GRACE_S + 1
    out = _run(engine)["r"]
    assert out.token_ids == hf_greedy(tiny_llama, prompt, GREEDY.max_tokens)
    assert list(exports.held) == ["x1"]  # enough room: the newer export stays
    assert exports.take(engine.runner, "x0") is None
    assert exports.take(engine.runner, "x1") is not None
    assert bm.num_free_blocks == bm.num_blocks


def test_an_aborted_import_frees_its_blocks(pair):
    prefill, decode = pair
    prompt = make_prompts([33], seed=10)[0]
    payload = _prefill(prefill, "p5", prompt)
    decode.add_request("d5", prompt_token_ids=prompt, sampling_params=GREEDY, kv_import=payload)
    assert decode.block_manager.num_free_blocks < decode.block_manager.num_blocks
    decode.abort("d5")
    assert decode.block_manager.num_free_blocks == decode.block_manager.num_blocks


def test_an_aborted_export_holds_nothing(pair):
    prefill, _ = pair
    prefill.add_request("p6", prompt_token_ids=make_prompts([20], seed=11)[0],
                        sampling_params=GREEDY, kv_export=True)
    prefill.step()
    prefill.abort("p6")
    assert not prefill.kv_exports.held
    assert prefill.block_manager.num_free_blocks == prefill.block_manager.num_blocks


def test_an_image_that_differs_cuts_the_import_before_it():
    from graft.serving.engine.kv_transfer import KVPayload

    payload = KVPayload({}, [1, 2, -1, -1, -1, 5, 6, 7], [("aaa", 2, 3)], torch.zeros(1))
    prompt = [1, 2, -1, -1, -1, 5, 6, 7, 8]
    assert importable_tokens(prompt, [("aaa", 2, 3)], payload) == 8
    assert importable_tokens(prompt, [("bbb", 2, 3)], payload) == 2
    assert importable_tokens(prompt[:8], [("aaa", 2, 3)], payload) == 7  # never the last token


def test_a_damaged_payload_is_named():
    with pytest.raises(ValueError, match="header"):
        decode_payload(b"\x05\x00\x00\x00{nope")
    with pytest.raises(ValueError, match="shorter"):
        decode_payload(b"\x01")


def _nixl_pair(pair):
    from graft.serving.engine.kv_nixl import NixlAgent, nixl_module

    if nixl_module() is None:
        pytest.skip("NIXL is not installed (pip install --no-deps nixl-cu12)")
    prefill, decode = pair
    for engine in pair:
        if engine.kv_exports.nixl is None:
            engine.kv_exports.nixl = NixlAgent(engine.runner)
    return prefill, decode


def _nixl_source(prefill, decode, rid, prompt):
    from graft.serving.engine.kv_transfer import NixlSource, kv_layout

    prefill.add_request(rid, prompt_token_ids=prompt, sampling_params=PREFILL, kv_export=True)
    _run(prefill)
    held = prefill.kv_exports.held[rid]
    return NixlSource(kv_layout(prefill.runner), held.token_ids, held.images,
                      prefill.kv_exports.nixl.handshake(), held.block_ids, rid,
                      decode.kv_exports.nixl)


def test_nixl_reads_the_blocks_into_the_pool_and_frees_them_there(tiny_llama):
    pair = (Engine.from_pretrained(tiny_llama, EngineConfig(block_size=16)),
            Engine.from_pretrained(tiny_llama, EngineConfig(block_size=16)))
    prefill, decode = _nixl_pair(pair)
    prompt = make_prompts([45], seed=12)[0]
    source = _nixl_source(prefill, decode, "n1", prompt)
    decode.add_request("d", prompt_token_ids=prompt, sampling_params=GREEDY, kv_import=source)
    out = _run(decode)["d"]
    assert out.num_cached_tokens == 44
    assert out.token_ids == hf_greedy(tiny_llama, prompt, GREEDY.max_tokens)
    _all_freed(pair)

    # a read that fails (here: pools of other block sizes) frees what it took and prefills
    prompt = make_prompts([45], seed=13)[0]
    source = _nixl_source(prefill, decode, "n2", prompt)
    source.remote = {**source.remote, "pools": [{**source.remote["pools"][0],
                                                 "block_bytes": 1}]}
    decode.add_request("d2", prompt_token_ids=prompt, sampling_params=GREEDY, kv_import=source)
    out = _run(decode)["d2"]
    assert out.num_cached_tokens == 0 and decode.kv_exports.stats.failure_reasons["transfer"] == 1
    assert out.token_ids == hf_greedy(tiny_llama, prompt, GREEDY.max_tokens)
    _all_freed(pair)  # the exporter is told to free its blocks all the same


def _all_freed(pair):
    import time

    prefill = pair[0]
    for _ in range(500):  # the exporter hears of the read through a NIXL notification
        prefill.kv_exports.expire()
        if not prefill.kv_exports.held:
            break
        time.sleep(0.01)
    for engine in pair:
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_other_weights_under_one_config_are_told_apart(tiny_llama, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    from graft.serving.engine.kv_transfer import weights_fingerprint

    other = tmp_path / "other"
    shutil.copytree(tiny_llama, other)
    weights = load_file(str(other / "model.safetensors"))
    name = sorted(weights)[-1]
    weights[name] = weights[name] + 1.0
    save_file(weights, str(other / "model.safetensors"), metadata={"format": "pt"})
    assert weights_fingerprint(tiny_llama) == weights_fingerprint(tiny_llama)
    assert weights_fingerprint(other) != weights_fingerprint(tiny_llama)
