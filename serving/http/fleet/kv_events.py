"""KV events in vLLM's wire format over ZMQ, for routers that route by what each worker's
prefix cache holds (vllm-router's kv_aware policy).

The wire shapes are vLLM's (vllm/distributed/kv_events.py): a batch is a msgpack array
[ts, events, data_parallel_rank]; each event a map tagged by its class name under "type".
Each message is three frames: topic, sequence number (8 bytes, big-endian), batch. An
optional ROUTER socket resends buffered batches from a sequence number, then (-1, b"").
The engine thread only appends to a KVEventSink; encoding and sockets live on this thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from itertools import count

from graft.errors import GraftConfigError
from graft.serving.engine import kv_events as engine_events
from graft.serving.http.fleet.kv_events_config import FLAG, KVEventsConfig

try:
    import msgspec
    import zmq
except ImportError as err:  # the `fleet` extra
    raise GraftConfigError(f"{FLAG}: publishing KV events needs pyzmq and msgspec ({err}); "
                           "install them: pip install 'graft-vlm[fleet]'") from None

log = logging.getLogger("graft.serving")

# vLLM's name for the engine's own KV pool (its "GPU" tier); graft's pool is that tier on
# CPU too, and routers credit other tiers less
MEDIUM = "GPU"
END_SEQ = (-1).to_bytes(8, "big", signed=True)  # a replay's last message


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Encoded as a map whose "type" is the class name."""


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


def external_hash(block_hash: bytes) -> int:
    """A chain hash as the 64-bit int vLLM publishes (its VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES
    form: the digest's low 64 bits, big-endian), which every consumer of vLLM's format reads."""
    return int.from_bytes(block_hash, "big") & ((1 << 64) - 1)


def wire_event(event, block_size: int):
    """An engine event (graft.serving.engine.kv_events) as its vLLM struct."""
    if isinstance(event, engine_events.BlockStored):
        parent = None if event.parent_hash is None else external_hash(event.parent_hash)
        return BlockStored([external_hash(h) for h in event.block_hashes], parent,
                           event.token_ids, block_size, None, MEDIUM, None)
    if isinstance(event, engine_events.BlockRemoved):
        return BlockRemoved([external_hash(h) for h in event.block_hashes], MEDIUM)
    return AllBlocksCleared()


class KVEventPublisher:
    """Publishes what `sink` records, one batch per wake-up of its thread, until `shutdown`."""

    def __init__(self, sink: engine_events.KVEventSink, config: KVEventsConfig,
                 block_size: int):
        self.sink, self.config, self.block_size = sink, config, block_size
        self._ctx = zmq.Context.instance()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(config.hwm)
        self._replay = None
        try:
            _bind_or_connect(self._pub, config.endpoint)
            if config.replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.bind(config.replay_endpoint)
        except zmq.ZMQError as err:
            self._close()
            raise GraftConfigError(f"{FLAG}: cannot open {err.strerror.lower()} on the endpoint "
                                   f"({config.endpoint}, replay {config.replay_endpoint}); pick "
                                   "a free address") from None
        self._topic = config.topic.encode()
        self._seq = count()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._encoder = msgspec.msgpack.Encoder()
        self._running = True
        self._dropped_seen = 0
        sink.enable(config.max_queue_size)
        self._thread = threading.Thread(target=self._loop, name="graft-kv-events", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        """Stop recording, publish what is still waiting, close the sockets."""
        self.sink.enabled = False
        self._running = False
        self._thread.join(timeout=5)
        self._close()

    def _close(self) -> None:
        for sock in (self._pub, self._replay):
            if sock is not None:
                sock.close(linger=0)

    def _loop(self) -> None:
        while True:
            running = self._running
            if self._replay is not None and self._replay.poll(0):
                self._serve_replay()
            events = self.sink.take(timeout=0.05 if running else None)
            if events:
                self._publish(events)
            elif not running:
                return
            self._warn_dropped()

    def _publish(self, events: list) -> None:
        batch = EventBatch(time.time(), [wire_event(e, self.block_size) for e in events], 0)
        seq, payload = next(self._seq), self._encoder.encode(batch)
        try:
            self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
        except zmq.ZMQError:  # a connect endpoint that is gone: a router replays what it missed
            log.exception("KV events: sending batch %d failed", seq)
        self._buffer.append((seq, payload))

    def _serve_replay(self) -> None:
        """[client, b"", start seq] in; every buffered batch from start, then END_SEQ, out."""
        frames = self._replay.recv_multipart()
        if len(frames) != 3:
            log.warning("KV events: ignoring a replay request of %d frames (want 3)", len(frames))
            return
        client, _, start = frames
        first = int.from_bytes(start, "big")
        for seq, payload in self._buffer:
            if seq >= first:
                self._replay.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, b"", END_SEQ, b""))

    def _warn_dropped(self) -> None:
        dropped = self.sink.dropped
        if dropped > self._dropped_seen:
            log.warning("KV events: %d events dropped (more than max_queue_size=%d waiting); "
                        "a router's view of this worker's cache is incomplete",
                        dropped - self._dropped_seen, self.config.max_queue_size)
            self._dropped_seen = dropped


def _bind_or_connect(sock, endpoint: str) -> None:
    """vLLM's rule: a wildcard, ipc or inproc address is bound, any other connected."""
    if "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://")):
        sock.bind(endpoint)
    else:
        sock.connect(endpoint)
