"""Which safetensors files hold an HF checkpoint dir's tensors: the sharded index, one file, or all."""

from __future__ import annotations

import json
from pathlib import Path

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


def read_weight_map(model_dir: str | Path) -> dict[str, str] | None:
    """{tensor name: shard file name} from the dir's sharded index; None when it has none."""
    index = Path(model_dir) / INDEX_NAME
    if not index.is_file():
        return None
    return json.loads(index.read_text())["weight_map"]


def safetensors_files(model_dir: str | Path) -> list[Path]:
    """The index's shards, else model.safetensors, else every *.safetensors (ValueError if none)."""
    model_dir = Path(model_dir)
    weight_map = read_weight_map(model_dir)
    if weight_map is not None:
        return [model_dir / s for s in sorted(set(weight_map.values()))]
    single = model_dir / SINGLE_NAME
    if single.is_file():
        return [single]
    found = sorted(model_dir.glob("*.safetensors"))
    if not found:
        raise ValueError(f"{model_dir}: no {SINGLE_NAME} or {INDEX_NAME}; "
                         "save the checkpoint with save_pretrained(safe_serialization=True)")
    return found
