"""Training checkpoints: projector (+ LoRA), optimizer, scheduler, RNG and data position.

A checkpoint is written into a temporary folder and renamed into place, so a crash
mid-write leaves nothing that --resume would trust.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

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


def save_trainable(model, out_dir: Path) -> None:
    """The projector (adapter.safetensors + adapter.json) and, if present, LoRA weights."""
    from graft.adapters import save_adapter

    save_adapter(model.projector, out_dir)
    if hasattr(model.llm, "peft_config"):
        model.llm.save_pretrained(str(RunDir(out_dir).lora_dir))


def save_checkpoint(run_dir: Path, step: int, model, optimizer, scheduler, position: dict) -> Path:
    def write(tmp: Path) -> None:
        save_trainable(model, tmp)
        atomic_torch_save({"step": step, "optimizer": optimizer.state_dict(),
                           "scheduler": scheduler.state_dict(), "rng": rng_state(),
                           "position": position}, tmp / TRAINER_STATE)

    return atomic_write_dir(RunDir(run_dir).checkpoints_dir / f"step_{step:08d}", write)


def latest_checkpoint(run_dir: Path) -> Path | None:
    root = RunDir(run_dir).checkpoints_dir
    if not root.is_dir():
        return None
    done = sorted(p for p in root.glob("step_*") if (p / TRAINER_STATE).is_file())
    return done[-1] if done else None


def load_checkpoint(ckpt: Path, model, optimizer, scheduler) -> dict:
    """Restore trainable weights, optimizer, scheduler and RNG; return the saved state."""
    from safetensors.torch import load_file

    saved = RunDir(ckpt)  # a checkpoint holds what a run dir holds, plus trainer_state.pt
    model.projector.load_state_dict(load_file(str(saved.adapter_weights)))
    if saved.has_lora:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file as load_lora

        set_peft_model_state_dict(model.llm, load_lora(str(saved.lora_dir / "adapter_model.safetensors")))
    state = torch.load(ckpt / TRAINER_STATE, map_location="cpu", weights_only=False)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    return state
