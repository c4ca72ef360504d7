"""Training checkpoints: projector (+ LoRA), optimizer, scheduler, RNG and data position.

A checkpoint is written into a temporary folder and renamed into place, so a crash
mid-write leaves nothing that --resume would trust.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from graft.errors import GraftConfigError
from graft.io import atomic_torch_save, atomic_write_dir
from graft.run_dir import TRAINER_STATE, RunDir

STATE_FILE = TRAINER_STATE  # old name, kept for importers


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_trainable(model, out_dir: Path, tensors: dict) -> None:
    """The projector (adapter.safetensors + adapter.json) and, if present, LoRA weights, from
    `tensors` (graft.train.sharding.trainable_tensors: whole, whatever the sharding)."""
    from graft.adapters import save_adapter

    save_adapter(model.projector, out_dir, state=tensors["projector"])
    if tensors["lora"] is not None:
        model.llm.save_pretrained(str(RunDir(out_dir).lora_dir), state_dict=tensors["lora"])


def save_checkpoint(run_dir: Path, step: int, model, tensors: dict, optimizer_state: dict,
                    scheduler, position: dict) -> Path:
    """Main process only; `tensors` and `optimizer_state` were gathered by every rank. Both are
    whole and keyed by name, so the checkpoint loads at any world size and sharding."""
    def write(tmp: Path) -> None:
        save_trainable(model, tmp, tensors)
        atomic_torch_save({"step": step, "optimizer": optimizer_state,
                           "scheduler": scheduler.state_dict(), "rng": rng_state(),
                           "position": position}, tmp / TRAINER_STATE)

    return atomic_write_dir(RunDir(run_dir).checkpoints_dir / f"step_{step:08d}", write)


def prune_checkpoints(run_dir: Path, keep: int) -> None:
    """Drop all but the newest `keep` complete checkpoints (0: keep all); a periodic save by
    default must not fill the disk on a long run."""
    if keep <= 0:
        return
    import shutil

    for old in _complete_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def _complete_checkpoints(run_dir: Path) -> list[Path]:
    """The run's checkpoints whose trainer state was written, oldest first."""
    root = RunDir(run_dir).checkpoints_dir
    return sorted(p for p in root.glob("step_*") if (p / TRAINER_STATE).is_file()) if root.is_dir() else []


def latest_checkpoint(run_dir: Path) -> Path | None:
    done = _complete_checkpoints(run_dir)
    return done[-1] if done else None


class DamagedCheckpoint(GraftConfigError):
    """A checkpoint whose files cannot be read back (empty, truncated, foreign, NaN)."""


STATE_KEYS = ("step", "optimizer", "scheduler", "rng", "position")


def load_checkpoint(ckpt: Path, model, optimizer, scheduler) -> dict:
    """Restore trainable weights, optimizer, scheduler and RNG on every rank (each reads the
    files; sharded parameters take their part); return the saved state. Every file is read
    and checked before anything is restored: a DamagedCheckpoint leaves the model as it was."""
    from graft.train.sharding import load_optimizer_state, load_trainable

    tensors, state = read_checkpoint(ckpt, model)
    load_trainable(model, tensors)
    load_optimizer_state(model, optimizer, state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    return state


def load_newest_intact(run_dir: Path, model, optimizer, scheduler, warn) -> tuple[Path, dict]:
    """load_checkpoint of the newest checkpoint that reads back; each damaged newer one is
    `warn`ed in one line and skipped. None intact: GraftConfigError naming every file."""
    damaged = []
    for ckpt in reversed(_complete_checkpoints(run_dir)):
        try:
            return ckpt, load_checkpoint(ckpt, model, optimizer, scheduler)
        except DamagedCheckpoint as err:
            damaged.append(str(err))
            warn(f"--resume: skipping damaged checkpoint {ckpt.name}: {err}; trying the one "
                 "before it")
    if not damaged:
        raise GraftConfigError(f"--resume: no complete checkpoint under "
                               f"{RunDir(run_dir).checkpoints_dir}")
    raise GraftConfigError(f"--resume: no intact checkpoint under {RunDir(run_dir).checkpoints_dir} "
                           f"({'; '.join(damaged)}); start the run again with --overwrite")


def read_checkpoint(ckpt: Path, model) -> tuple[dict, dict]:
    """(trainable tensors, trainer state) of `ckpt`, read and checked, the model untouched
    (it only names the LoRA tensors this run trains); DamagedCheckpoint naming the file."""
    from graft.adapters.checkpoint import read_adapter_weights

    saved = RunDir(ckpt)  # a checkpoint holds what a run dir holds, plus trainer_state.pt
    try:
        tensors = {"projector": read_adapter_weights(saved.adapter_weights), "lora": None}
    except GraftConfigError as err:  # its advice (retrain) is for a run dir: here the reason
        raise DamagedCheckpoint(str(err).split("; ")[0]) from None
    if saved.has_lora:
        tensors["lora"] = _read_lora(saved.lora_dir, model)
    path = ckpt / TRAINER_STATE
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # EOFError when empty, UnpicklingError/RuntimeError when cut short
        raise DamagedCheckpoint(f"{path} is not a readable trainer state "
                                f"({type(err).__name__}: {err or 'no data'})") from None
    missing = [k for k in STATE_KEYS if k not in state] if isinstance(state, dict) else STATE_KEYS
    if missing:
        raise DamagedCheckpoint(f"{path} is not a trainer state (no {', '.join(missing)})")
    return tensors, state


def _read_lora(lora_dir: Path, model) -> dict:
    from peft.utils import load_peft_weights

    try:
        raw = load_peft_weights(str(lora_dir), device="cpu")
    except Exception as err:  # safetensors' own error, or OSError
        raise DamagedCheckpoint(f"{lora_dir} is not readable LoRA weights "
                                f"({type(err).__name__}: {err})") from None
    # peft saves names without the adapter's ("default"); the model's names hold it. The spec
    # matches the run's (--resume checked it), so a missing tensor is a damaged file
    names = [k for k in model.llm.state_dict() if "lora_" in k]
    missing = [k for k in names if k.replace(".default.", ".") not in raw]
    if missing:
        raise DamagedCheckpoint(f"{lora_dir} lacks LoRA tensors this run trains, e.g. "
                                f"{missing[:2]}")
    return {k: raw[k.replace(".default.", ".")] for k in names}
