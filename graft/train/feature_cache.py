"""Disk cache of frozen-encoder outputs, keyed by image content and encoder identity.

The encoder is frozen, so its output for an image never changes: computing it once and
reusing it across epochs and runs removes the encoder from the training step.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from graft.io import atomic_write


def check_cache_root(root: str | Path) -> Path:
    """GraftConfigError naming train.feature_cache unless it is (or can become) a folder this
    user writes in; creates nothing, so `graft train --dry-run` can call it."""
    from graft.errors import GraftConfigError
    from graft.io import OutputPathError, check_output_path

    try:
        return check_output_path(root, "dir")
    except OutputPathError as err:
        raise GraftConfigError(f"train.feature_cache={str(root)!r} cannot hold the cache ({err}); "
                               "point it at a folder you can write, or drop it (no cache)") from None


class FeatureCache:
    def __init__(self, root: str | Path, encoder_identity: str):
        root = check_cache_root(root)
        # encoder.identity() covers kind, weights digest, feature layer and preprocessing
        tag = hashlib.sha256(encoder_identity.encode()).hexdigest()[:16]
        self.dir = Path(root) / tag
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "identity.txt").write_text(encoder_identity)
        self.hits = 0
        self.misses = 0

    def warm(self) -> bool:
        """Whether any features are stored yet (a cold cache encodes every image first)."""
        return any(self.dir.glob("*/*.safetensors"))

    def _path(self, content_hash: str) -> Path:
        return self.dir / content_hash[:2] / f"{content_hash}.safetensors"

    def get(self, content_hash: str) -> torch.Tensor | None:
        path = self._path(content_hash)
        if not path.is_file():
            self.misses += 1
            return None
        try:
            feats = load_file(str(path))["features"]
        except Exception:  # a damaged entry is recomputed, never trusted
            path.unlink(missing_ok=True)
            self.misses += 1
            return None
        self.hits += 1
        return feats

    def put(self, content_hash: str, features: torch.Tensor) -> None:
        atomic_write(self._path(content_hash), lambda tmp: save_file(
            {"features": features.detach().cpu().contiguous()}, str(tmp)))
