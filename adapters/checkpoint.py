"""Save/load a projector alone: adapter.safetensors + adapter.json (config, d_vision, d_model)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from graft.adapters.base import Projector
from graft.adapters.config import AdapterConfig
from graft.adapters.registry import build_adapter
from graft.errors import GraftConfigError
from graft.io import atomic_write_bytes, atomic_write_json

WEIGHTS_NAME = "adapter.safetensors"
CONFIG_NAME = "adapter.json"


def save_adapter(proj: Projector, out_dir: str | os.PathLike, state: dict | None = None) -> Path:
    """Write the projector's weights and config into out_dir (created if needed); returns the dir.
    `state`: its state dict as whole tensors, when the module's own are sharded (FSDP)."""
    from safetensors.torch import save

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # Tensors must be contiguous CPU copies: safetensors refuses views and shared storage.
    state = {k: v.detach().to("cpu").contiguous().clone()
             for k, v in (proj.state_dict() if state is None else state).items()}
    meta = {"config": proj.config.to_dict(), "d_vision": proj.d_vision, "d_model": proj.d_model}
    # serialized here, written by Python: a full disk is an OSError (ENOSPC) the CLI can name
    atomic_write_bytes(out / WEIGHTS_NAME, save(state, metadata={"format": "pt"}))
    atomic_write_json(out / CONFIG_NAME, meta)
    return out


def read_adapter_weights(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The tensors of an adapter.safetensors, checked: a truncated, empty or foreign file and
    a tensor holding NaN or inf (a diverged run) are GraftConfigErrors naming the file and the
    tensor, never a traceback or a projector that answers garbage."""
    from safetensors.torch import load_file

    try:
        state = load_file(str(path))
    except Exception as err:  # safetensors raises its own SafetensorError, or OSError
        raise GraftConfigError(f"{path} is not a readable safetensors file ({err}); it is "
                               "damaged: retrain, or copy it again from where it was written"
                               ) from None
    for name, tensor in state.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise GraftConfigError(f"{path}: tensor {name!r} holds values that are not finite "
                                   "(NaN or inf: training diverged); use an earlier checkpoint "
                                   "or retrain with a lower learning rate")
    return state


def load_adapter(in_dir: str | os.PathLike, d_vision: int | None = None, d_model: int | None = None) -> Projector:
    """The saved projector (fp32, CPU); pass d_vision/d_model to check it fits an encoder/LLM pair."""
    root = Path(in_dir)
    for name in (CONFIG_NAME, WEIGHTS_NAME):
        if not (root / name).is_file():
            raise GraftConfigError(f"adapter dir {str(root)!r} has no {name}; it must hold {CONFIG_NAME} and {WEIGHTS_NAME} (save_adapter writes both)")
    try:
        meta = json.loads((root / CONFIG_NAME).read_text())
        cfg = AdapterConfig.from_dict(meta["config"])
        saved_vision, saved_model = int(meta["d_vision"]), int(meta["d_model"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        if isinstance(err, GraftConfigError):
            raise
        why = (f"no {err.args[0]!r} field" if isinstance(err, KeyError)
               else f"{type(err).__name__}: {err}")
        raise GraftConfigError(f"{root / CONFIG_NAME} is not a valid adapter config ({why}); "
                               "it must hold config, d_vision and d_model as save_adapter "
                               "writes them") from err
    for name, want, have in (("d_vision", d_vision, saved_vision), ("d_model", d_model, saved_model)):
        if want is not None and want != have:
            raise GraftConfigError(
                f"adapter in {str(root)!r} was trained for {name}={have}, but this model needs {name}={want}; "
                "use an adapter trained for this encoder/LLM pair"
            )
    proj = build_adapter(cfg, saved_vision, saved_model)
    state = read_adapter_weights(root / WEIGHTS_NAME)
    own = proj.state_dict()
    problems = [f"missing {k}" for k in own if k not in state]
    problems += [f"unexpected {k}" for k in state if k not in own]
    problems += [f"{k}: file {tuple(state[k].shape)} vs config {tuple(own[k].shape)}"
                 for k in own if k in state and state[k].shape != own[k].shape]
    if problems:
        raise GraftConfigError(f"{root / WEIGHTS_NAME} does not match {CONFIG_NAME}: {'; '.join(problems[:6])}")
    with torch.no_grad():
        proj.load_state_dict(state, strict=True)
    return proj
