"""`graft serve --kv-events-config JSON`: vLLM's KVEventsConfig (vllm/config/kv_events.py),
the same field names, defaults and meaning, so a fleet's launch scripts carry over."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json

from graft.errors import GraftConfigError

FLAG = "--kv-events-config"
PUBLISHERS = ("null", "zmq")
EXAMPLE = '{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557"}'


@dataclasses.dataclass
class KVEventsConfig:
    enable_kv_cache_events: bool = False  # record block stored / removed / all-cleared events
    publisher: str | None = None  # "zmq" | "null"; default: zmq when events are enabled
    endpoint: str = "tcp://*:5557"  # PUB socket: bound when it has * (or ipc/inproc), else connected
    replay_endpoint: str | None = None  # ROUTER socket resending batches from a sequence number
    buffer_steps: int = 10_000  # batches kept for replay
    hwm: int = 100_000  # ZMQ high-water mark of the PUB socket
    max_queue_size: int = 100_000  # events waiting for the publisher thread before new ones drop
    topic: str = ""  # first frame of every message; subscribers filter on it

    def __post_init__(self) -> None:
        if self.publisher is None:
            self.publisher = "zmq" if self.enable_kv_cache_events else "null"

    @property
    def publishing(self) -> bool:
        return self.enable_kv_cache_events and self.publisher == "zmq"


def parse_kv_events_config(value: str | dict) -> KVEventsConfig:
    """The flag's JSON text (or a serve YAML mapping) as a KVEventsConfig; a bad one raises
    GraftConfigError naming the field and the fix."""
    if isinstance(value, KVEventsConfig):
        return value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise GraftConfigError(f"{FLAG}: not valid JSON ({err.msg} at character {err.pos}); "
                                   f"give an object, e.g. '{EXAMPLE}'") from None
    if not isinstance(value, dict):
        raise GraftConfigError(f"{FLAG}: must be a JSON object, e.g. '{EXAMPLE}'")
    fields = {f.name: f for f in dataclasses.fields(KVEventsConfig)}
    for key, item in value.items():
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"the fields: {', '.join(fields)}"
            raise GraftConfigError(f"{FLAG}: unknown field {key!r}; {hint}")
        _check(key, item)
    return KVEventsConfig(**value)


def _check(key: str, item) -> None:
    where = f"{FLAG}: {key}"
    if key == "enable_kv_cache_events":
        if not isinstance(item, bool):
            raise GraftConfigError(f"{where} must be true or false, got {item!r}")
    elif key == "publisher":
        if item not in PUBLISHERS:
            raise GraftConfigError(f"{where} must be one of {', '.join(PUBLISHERS)}, got {item!r}")
    elif key in ("buffer_steps", "hwm", "max_queue_size"):
        if not isinstance(item, int) or isinstance(item, bool) or item < 1:
            raise GraftConfigError(f"{where} must be a positive integer, got {item!r}")
    elif key == "topic":
        if not isinstance(item, str):
            raise GraftConfigError(f"{where} must be a string, got {item!r}")
    elif not (item is None and key == "replay_endpoint"):
        if not isinstance(item, str) or not item.startswith(("tcp://", "ipc://", "inproc://")):
            raise GraftConfigError(f"{where} must be a ZMQ address such as tcp://*:5557 "
                                   f"(tcp://, ipc:// or inproc://), got {item!r}")


def flag_type(text: str) -> KVEventsConfig:
    """argparse type: the error names the flag and the fix."""
    try:
        return parse_kv_events_config(text)
    except GraftConfigError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix(f"{FLAG}: ")) from None
