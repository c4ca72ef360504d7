"""--kv-events-config: the config as vLLM's KVEventsConfig reads, the encoding decoded with
vLLM's msgspec definitions, and a real engine's events received over real ZMQ sockets (live
with sequence numbers, and from the replay socket)."""

import argparse
import json
import time

import httpx
import pytest

msgspec = pytest.importorskip("msgspec", reason="the fleet extra (pyzmq, msgspec) is not installed")
zmq = pytest.importorskip("zmq", reason="the fleet extra (pyzmq, msgspec) is not installed")

from graft.errors import GraftConfigError  # noqa: E402
from graft.serving import Engine, EngineConfig  # noqa: E402
from graft.serving.engine.block_manager import chain_hash  # noqa: E402
from graft.serving.engine.sampling_params import SamplingParams  # noqa: E402
from graft.serving.http.fleet.kv_events import KVEventPublisher, external_hash  # noqa: E402
from graft.serving.http.fleet.kv_events_config import (  # noqa: E402
    KVEventsConfig, parse_kv_events_config)
from tests.serving.http.conftest import LiveServer, _free_port  # noqa: E402


# --- vLLM's definitions, mirrored from vllm/distributed/kv_events.py (EventBatch is
# array_like, the events tagged maps; ExternalBlockHash = bytes | int): a decoder built from
# them must read what graft sends.
class VllmEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list
    data_parallel_rank: int | None = None


class VllmKVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class VllmBlockStored(VllmKVCacheEvent, tag="BlockStored"):
    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class VllmBlockRemoved(VllmKVCacheEvent, tag="BlockRemoved"):
    block_hashes: list[bytes | int]
    medium: str | None
    group_idx: int | None = None


class VllmAllBlocksCleared(VllmKVCacheEvent, tag="AllBlocksCleared"):
    pass


class VllmKVEventBatch(VllmEventBatch):
    events: list[VllmBlockStored | VllmBlockRemoved | VllmAllBlocksCleared]


DECODE = msgspec.msgpack.Decoder(type=VllmKVEventBatch)
GREEDY = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
BS = 4


# --- config ---------------------------------------------------------------------------
def test_config_has_vllms_fields_and_defaults():
    cfg = parse_kv_events_config('{"enable_kv_cache_events": true}')
    assert (cfg.publisher, cfg.endpoint, cfg.replay_endpoint, cfg.buffer_steps, cfg.hwm,
            cfg.max_queue_size, cfg.topic) == ("zmq", "tcp://*:5557", None, 10_000, 100_000,
                                               100_000, "")
    assert cfg.publishing
    assert parse_kv_events_config("{}").publisher == "null"  # off unless enabled, as vLLM
    assert not parse_kv_events_config(
        '{"enable_kv_cache_events": true, "publisher": "null"}').publishing


@pytest.mark.parametrize("text, words", [
    ('{"enable_kv_cache_events": true', "not valid JSON"),
    ('["zmq"]', "must be a JSON object"),
    ('{"enable_kv_cache_event": true}',
     "unknown field 'enable_kv_cache_event'; did you mean 'enable_kv_cache_events'?"),
    ('{"colour": 1}', "unknown field 'colour'; the fields: enable_kv_cache_events, publisher"),
    ('{"publisher": "kafka"}', "publisher must be one of null, zmq"),
    ('{"endpoint": "localhost:5557"}', "endpoint must be a ZMQ address"),
    ('{"hwm": 0}', "hwm must be a positive integer"),
    ('{"enable_kv_cache_events": "yes"}', "enable_kv_cache_events must be true or false"),
])
def test_bad_config_is_one_line_naming_the_field(text, words, capsys):
    with pytest.raises(GraftConfigError, match="--kv-events-config") as err:
        parse_kv_events_config(text)
    assert words in str(err.value) and "\n" not in str(err.value)
    from graft.serving.http import serve_cli

    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["x", "--kv-events-config", text])
    assert words in capsys.readouterr().err


# --- encoding and sockets ----------------------------------------------------------------
@pytest.fixture(scope="module")
def engine(tiny_llama):
    return Engine.from_pretrained(tiny_llama, EngineConfig(block_size=BS, num_kv_blocks=16))


def _subscriber(port: int, topic: bytes = b""):
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, topic)
    sub.setsockopt(zmq.RCVTIMEO, 200)
    sub.connect(f"tcp://127.0.0.1:{port}")
    return sub


def _until_subscribed(sub, engine, first_token: int):
    """A PUB socket drops what it sends before a subscription reaches it: run one-block
    prompts until the subscriber hears one (retries, never a timing assertion)."""
    for k in range(200):
        prompt = [first_token] + [1 + k] * BS  # a new first block each time
        engine.generate(prompt_token_ids=[prompt], sampling_params=GREEDY)
        try:
            return sub.recv_multipart()
        except zmq.Again:
            continue
    raise AssertionError("no KV event batch reached the subscriber")


def _drain(sub) -> list:
    frames = []
    while True:
        try:
            frames.append(sub.recv_multipart())
        except zmq.Again:
            return frames


def test_engine_events_over_zmq_decode_as_vllms_structs_with_sequence_numbers(engine):
    port, replay_port = _free_port(), _free_port()
    cfg = KVEventsConfig(enable_kv_cache_events=True, endpoint=f"tcp://*:{port}",
                         replay_endpoint=f"tcp://*:{replay_port}", topic="kv@w0")
    publisher = KVEventPublisher(engine.block_manager.events, cfg, BS)
    try:
        sub = _subscriber(port, b"kv@w0")
        first = _until_subscribed(sub, engine, 300)
        prompt = list(range(10, 20))  # two full blocks and two tokens
        out = engine.generate(prompt_token_ids=[prompt], sampling_params=GREEDY)[0]
        assert engine.block_manager.reset_prefix_cache()
        deadline = time.monotonic() + 30  # the publisher thread's turn; not a speed check
        frames = []
        while time.monotonic() < deadline and not any(
                isinstance(e, VllmAllBlocksCleared)
                for f in frames for e in DECODE.decode(f[2]).events):
            frames += _drain(sub)
        frames = [first] + frames
        assert {f[0] for f in frames} == {b"kv@w0"}
        seqs = [int.from_bytes(f[1], "big") for f in frames]
        assert seqs == list(range(seqs[0], seqs[0] + len(frames)))  # consecutive, 8-byte BE
        assert all(len(f[1]) == 8 for f in frames)

        batches = [DECODE.decode(f[2]) for f in frames]
        assert all(b.data_parallel_rank == 0 and b.ts > 0 for b in batches)
        events = [e for b in batches for e in b.events]
        stored = [e for e in events if isinstance(e, VllmBlockStored)]
        tokens = out.prompt_token_ids + out.token_ids
        want = [chain_hash(None, tokens[:BS])]
        want.append(chain_hash(want[0], tokens[BS:2 * BS]))
        mine = next(e for e in stored if e.token_ids[:BS] == tokens[:BS])
        assert mine.block_hashes[:2] == [external_hash(h) for h in want]
        assert mine.parent_block_hash is None and mine.token_ids[:2 * BS] == tokens[:2 * BS]
        assert (mine.block_size, mine.medium, mine.lora_id, mine.lora_name) == (BS, "GPU", None,
                                                                                None)
        assert isinstance(events[-1], VllmAllBlocksCleared)

        # the raw shape vLLM's consumers parse: batch = array, event = map tagged "type"
        raw = msgspec.msgpack.decode(frames[-1][2])
        assert isinstance(raw, list) and raw[1][-1] == {"type": "AllBlocksCleared"}

        # replay: every buffered batch from a sequence number, then (-1, b""); a DEALER
        # sends the empty delimiter a REQ socket would
        dealer = zmq.Context.instance().socket(zmq.DEALER)
        dealer.setsockopt(zmq.RCVTIMEO, 10_000)
        dealer.connect(f"tcp://127.0.0.1:{replay_port}")
        dealer.send_multipart([b"", seqs[1].to_bytes(8, "big")])
        replayed = []
        while True:
            empty, seq, payload = dealer.recv_multipart()
            if seq == (-1).to_bytes(8, "big", signed=True):
                assert payload == b""
                break
            replayed.append((int.from_bytes(seq, "big"), payload))
        assert replayed == [(s, f[2]) for s, f in zip(seqs[1:], frames[1:])]
        dealer.close(linger=0)
        sub.close(linger=0)
    finally:
        publisher.shutdown()
    assert not engine.block_manager.events.enabled


def test_removed_blocks_are_announced(engine):
    port = _free_port()
    cfg = KVEventsConfig(enable_kv_cache_events=True, endpoint=f"tcp://*:{port}")
    publisher = KVEventPublisher(engine.block_manager.events, cfg, BS)
    try:
        sub = _subscriber(port)
        _until_subscribed(sub, engine, 301)
        # 16 blocks: five 5-block requests evict what the earlier ones cached
        for k in range(5):
            engine.generate(prompt_token_ids=[list(range(40 + 20 * k, 58 + 20 * k))],
                            sampling_params=GREEDY)
        events = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(
                isinstance(e, VllmBlockRemoved) for e in events):
            events += [e for f in _drain(sub) for e in DECODE.decode(f[2]).events]
        removed = [h for e in events if isinstance(e, VllmBlockRemoved) for h in e.block_hashes]
        assert removed and len(removed) == len(set(removed))
        assert all(e.medium == "GPU" for e in events if isinstance(e, VllmBlockRemoved))
        assert not set(removed) & {external_hash(k) for k in engine.block_manager.cache}
        sub.close(linger=0)
    finally:
        publisher.shutdown()


def test_endpoint_in_use_is_a_clear_error(engine):
    port = _free_port()
    holder = zmq.Context.instance().socket(zmq.PUB)
    holder.bind(f"tcp://*:{port}")
    try:
        with pytest.raises(GraftConfigError, match=f"--kv-events-config.*tcp://\\*:{port}"):
            KVEventPublisher(engine.block_manager.events,
                             KVEventsConfig(enable_kv_cache_events=True,
                                            endpoint=f"tcp://*:{port}"), BS)
        assert not engine.block_manager.events.enabled
    finally:
        holder.close(linger=0)


# --- graft serve ------------------------------------------------------------------------
def test_graft_serve_publishes_a_chats_prompt_blocks(tiny_run_dir):
    from graft.serving.http import serve_cli

    port = _free_port()
    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    config = json.dumps({"enable_kv_cache_events": True, "endpoint": f"tcp://*:{port}"})
    args = parser.parse_args([str(tiny_run_dir), "--served-model-name", "tiny",
                              "--max-model-len", "256", "--num-kv-blocks", "64",
                              "--block-size", str(BS), "--kv-events-config", config])
    app = serve_cli.build(args)
    publisher = app.state.kv_events
    assert publisher is not None
    try:
        with LiveServer(app) as server:
            sub = _subscriber(port)
            body = {"model": "tiny", "max_tokens": 2, "temperature": 0,
                    "messages": [{"role": "user", "content": "Say something about blocks."}]}
            events = []
            for _ in range(200):  # until the subscription is through (see _until_subscribed)
                r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
                assert r.status_code == 200, r.text
                events += [e for f in _drain(sub) for e in DECODE.decode(f[2]).events]
                if events:
                    break
                body["messages"][0]["content"] += " again"
            stored = [e for e in events if isinstance(e, VllmBlockStored)]
            n_prompt = r.json()["usage"]["prompt_tokens"]
            assert stored and len(stored[0].token_ids) >= (n_prompt // BS) * BS
            rendered = httpx.post(server.url + "/v1/chat/completions/render", json=body,
                                  timeout=60)
            if rendered.status_code == 200:  # what a router matches the blocks against
                ids = rendered.json()["token_ids"]
                assert stored[0].token_ids[:len(ids) // BS * BS] == ids[:len(ids) // BS * BS]
            sub.close(linger=0)
    finally:
        publisher.shutdown()
