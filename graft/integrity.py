"""Digest of a module's frozen weights: proof that training left the LLM untouched."""

from __future__ import annotations

import hashlib

import torch


def params_digest(module: torch.nn.Module) -> str:
    """sha256 over every non-LoRA parameter and buffer (name, dtype, shape, bytes); of a
    sharded parameter, the part this process holds."""
    from torch.distributed.tensor import DTensor

    h = hashlib.sha256()
    tensors = list(module.named_parameters()) + list(module.named_buffers())
    for name, t in sorted(tensors, key=lambda kv: kv[0]):
        if "lora_" in name:
            continue
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        if isinstance(t, DTensor):  # sharded (FSDP): this rank's part
            t = t.to_local()
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
