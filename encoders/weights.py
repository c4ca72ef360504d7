"""Weights files: sha256 digests (cached per file version) and state-dict loading."""

from __future__ import annotations

import os
from pathlib import Path

from graft.digests import sha256_file as _sha256_file
from graft.errors import GraftConfigError


def sha256_file(path: str | os.PathLike) -> str:
    """Cached per file version: hashing a multi-GB checkpoint once per process is enough."""
    return _sha256_file(path, cached=True)


def load_state_dict_file(path: str | os.PathLike, field_name: str = "encoder.path") -> dict:
    """A flat {name: tensor} from .safetensors or a torch pickle (.pth/.pt/.bin), unwrapping
    a top-level "state_dict"/"model" nesting and a DataParallel "module." prefix."""
    import torch

    p = Path(path)
    if not p.is_file():
        raise GraftConfigError(f"{field_name}: weights file {str(p)!r} does not exist; give a .safetensors or .pth file")
    if p.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            sd = load_file(str(p))
        except Exception as err:  # safetensors raises its own header errors
            raise GraftConfigError(f"{field_name}: {str(p)!r} is not a readable safetensors file ({err})") from err
    else:
        try:
            sd = torch.load(str(p), map_location="cpu", weights_only=True)
        except Exception as err:
            raise GraftConfigError(
                f"{field_name}: {str(p)!r} is not a loadable torch checkpoint ({type(err).__name__}: {err}); "
                "save a plain state_dict (torch.save(model.state_dict(), ...)) or a .safetensors file"
            ) from err
        for nest in ("state_dict", "model"):
            if isinstance(sd, dict) and isinstance(sd.get(nest), dict):
                sd = sd[nest]
                break
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise GraftConfigError(f"{field_name}: {str(p)!r} does not hold a state_dict of tensors")
    if sd and all(k.startswith("module.") for k in sd):
        sd = {k[len("module."):]: v for k, v in sd.items()}
    return sd
