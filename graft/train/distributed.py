"""Data-parallel training that equals one process over the global batch.

Each process holds a slice of the global batch, and its answers may have a different
number of label tokens than the others'. The loss is the mean over every label token of the
global batch: each process backpropagates its token *sum* divided by the global token count
(all-reduced), times the world size because DDP averages gradients over processes.
"""

from __future__ import annotations

import logging
import os

import torch

from graft.errors import GraftConfigError
from graft.template import IGNORE_INDEX

log = logging.getLogger("graft.train.distributed")

CPU_LAUNCH = "ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes N -m graft.cli train CONFIG"


def check_launch(accel, env=os.environ) -> None:
    """Refuse the launches that look like data parallelism but are not; log the world size."""
    from graft.cli_types import env_int

    world = env_int("WORLD_SIZE", 1, env=env)
    if world != accel.num_processes:
        # torchrun started `world` processes, but each one set itself up alone (no CUDA and no
        # ACCELERATE_USE_CPU): they would train separately and write the same run dir
        raise GraftConfigError(
            f"WORLD_SIZE={world} processes were launched but each runs alone (accelerate sees "
            f"{accel.num_processes}); on CPUs launch with: {CPU_LAUNCH}")
    if world == 1 and "MASTER_PORT" in env and "ACCELERATE_USE_CPU" in env:
        # `accelerate launch --cpu --num_processes N` sets MASTER_PORT and starts one process
        raise GraftConfigError(
            "accelerate launch asked for several processes but started one (--cpu without "
            f"--multi_gpu does that); on CPUs launch with: {CPU_LAUNCH}")
    log.info("world size %d (%s), process %d", accel.num_processes, accel.distributed_type,
             accel.process_index)


def label_tokens(labels: torch.Tensor) -> torch.Tensor:
    """How many tokens carry a loss: labels shifted by one, IGNORE_INDEX skipped (as the loss does)."""
    return (labels[:, 1:] != IGNORE_INDEX).sum()


def global_token_loss(loss: torch.Tensor, labels: torch.Tensor, accel,
                      weight: float = 1.0) -> tuple[torch.Tensor, float]:
    """(what this process backpropagates, the global batch's per-token mean loss).

    `loss` is this process's mean over its own label tokens. With one process both are the
    loss itself, untouched (so single-process runs stay bit-identical). weight=0 marks a
    stand-in micro-batch that only keeps this process in step: it counts no token.
    """
    if accel.num_processes == 1:
        return loss, loss.item()
    local = label_tokens(labels).to(loss.device, torch.float64) * weight
    token_sum = loss * local.to(loss.dtype)
    counts = accel.reduce(torch.stack([local, token_sum.detach().double()]), reduction="sum")
    n_global = counts[0].clamp(min=1)
    scaled = token_sum * (accel.num_processes / n_global).to(loss.dtype)
    return scaled, float(counts[1] / n_global)
