"""The Responses a server keeps (`graft serve --responses-store-mb`), for `previous_response_id`
and GET / DELETE /v1/responses/{id}: each with its whole conversation as Responses input items
(the input it was given, then its own output), least recently used first out, bounded by the
bytes of their JSON. Off (0 MB) by default, as in vLLM: nothing a client sends is kept."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict


class ResponseStore:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, tuple[dict, list[dict], int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # big bodies are parsed (and looked up) off the loop

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def put(self, response: dict, conversation: list[dict]) -> None:
        """Keep `response` and the items a follow-up continues from; one bigger than the whole
        store is not kept."""
        size = len(json.dumps(response)) + len(json.dumps(conversation))
        if size > self.max_bytes:
            return
        with self._lock:
            self._drop(response["id"])
            self._items[response["id"]] = (response, conversation, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                self._drop(next(iter(self._items)))

    def get(self, rid: str) -> tuple[dict, list[dict]] | None:
        """(the Response, its conversation) or None; a hit is used most recently."""
        with self._lock:
            found = self._items.get(rid)
            if found is None:
                return None
            self._items.move_to_end(rid)
            return found[0], found[1]

    def delete(self, rid: str) -> bool:
        with self._lock:
            return self._drop(rid)

    def _drop(self, rid: str) -> bool:
        found = self._items.pop(rid, None)
        if found is not None:
            self._bytes -= found[2]
        return found is not None


def as_input(output: list[dict]) -> list[dict]:
    """A Response's output items as the input items that continue it: its message as an
    assistant message, its calls as they are, its thinking left out (templates drop it)."""
    items = []
    for item in output:
        if item["type"] == "message":
            items.append({"role": "assistant", "content": [
                {"type": "output_text", "text": part["text"]} for part in item["content"]]})
        elif item["type"] == "function_call":
            items.append({k: item[k] for k in ("type", "call_id", "name", "arguments")})
    return items
