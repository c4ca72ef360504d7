"""NIXL transport for the prefill/decode split: the decode engine READs the prefill engine's
KV blocks straight into blocks of its own pool, over UCX, as vLLM's NixlConnector does. Each
engine's agent registers its whole KV pool once; a handshake (agent metadata, the pool's
address and strides) tells a reader where any block lies. NIXL is optional
(`pip install --no-deps nixl-cu12`; its UCX backend moves CPU memory too); without it the KV
travels over HTTP (kv_transfer.KVPayload).
"""

from __future__ import annotations

import base64
import time
import uuid

READ_TIMEOUT_S = 30.0


def nixl_module():
    """NIXL's Python API, or None when it is not installed (or cannot load here)."""
    for name in ("nixl_cu12", "nixl_cu13", "nixl._api"):
        try:
            module = __import__(name, fromlist=["nixl_agent"])
            if hasattr(module, "nixl_agent"):
                return module
        except Exception:  # noqa: BLE001 - a wheel built for another CUDA fails to load
            continue
    return None


class NixlAgent:
    """This engine's NIXL agent with its KV pool registered (engine thread only)."""

    def __init__(self, runner, name: str | None = None):
        nixl = nixl_module()
        if nixl is None:
            raise RuntimeError("NIXL is not installed (pip install --no-deps nixl-cu12)")
        self.runner = runner
        self.name = name or f"graft-{uuid.uuid4().hex[:12]}"
        self.agent = nixl.nixl_agent(self.name, nixl.nixl_agent_config(backends=["UCX"]))
        self.tensors = [runner.kv_cache] + ([runner.kv_scales] if runner.kv_scales is not None
                                            else [])
        self.registered = [self.agent.register_memory(t) for t in self.tensors]
        self.remotes: set[str] = set()
        self._handshake = None

    def handshake(self) -> dict:
        """What a reader needs: the agent's metadata and where each pool lies."""
        if self._handshake is None:
            self._handshake = {
                "agent": self.name,
                "metadata": base64.b64encode(self.agent.get_agent_metadata()).decode(),
                "block_size": self.runner.block_size,
                "pools": [_pool(t) for t in self.tensors]}
        return self._handshake

    def read(self, remote: dict, remote_blocks: list[int], local_blocks: list[int],
             notify: str) -> None:
        """Copy whole remote blocks into local blocks (every layer, K and V, int8 scales too);
        the remote agent is told `notify` when the read is done. RuntimeError on failure."""
        if remote["agent"] not in self.remotes:
            self.agent.add_remote_agent(base64.b64decode(remote["metadata"]))
            self.remotes.add(remote["agent"])
        mine = [_pool(t) for t in self.tensors]
        if len(mine) != len(remote["pools"]):
            raise RuntimeError("the two KV pools differ in kind (int8 scales on one side only)")
        local, theirs = [], []
        for here, there in zip(mine, remote["pools"]):
            if here["block_bytes"] != there["block_bytes"]:
                raise RuntimeError(f"block bytes differ ({there['block_bytes']} there, "
                                   f"{here['block_bytes']} here)")
            local += _regions(here, local_blocks)
            theirs += _regions(there, remote_blocks)
        handle = self.agent.initialize_xfer(
            "READ", self.agent.get_xfer_descs(local, "DRAM"),
            self.agent.get_xfer_descs(theirs, "DRAM"), remote["agent"], notify.encode())
        try:
            state = self.agent.transfer(handle)
            end = time.monotonic() + READ_TIMEOUT_S
            while state != "DONE":
                if state == "ERR" or time.monotonic() > end:
                    raise RuntimeError(f"NIXL read from {remote['agent']} ended in {state}")
                state = self.agent.check_xfer_state(handle)
        finally:
            self.agent.release_xfer_handle(handle)

    def read_notifications(self) -> list[str]:
        """Request ids whose KV a reader has finished reading since the last call."""
        return [msg.decode() for msgs in self.agent.get_new_notifs().values() for msg in msgs]


def _pool(t) -> dict:
    """A pool's address and byte strides: [layers, 2, blocks, ...], one block contiguous."""
    elem = t.element_size()
    return {"addr": t.data_ptr(), "layer": t.stride(0) * elem, "kv": t.stride(1) * elem,
            "block_bytes": t.stride(2) * elem, "layers": t.shape[0]}


def _regions(pool: dict, blocks: list[int]) -> list[tuple[int, int, int]]:
    size = pool["block_bytes"]
    return [(pool["addr"] + layer * pool["layer"] + kv * pool["kv"] + b * size, size, 0)
            for layer in range(pool["layers"]) for kv in (0, 1) for b in blocks]
