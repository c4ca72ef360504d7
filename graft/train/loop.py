"""The training loop: projector only (align) or projector + LoRA (finetune), LLM frozen.

Runs on accelerate (CPU, one GPU, `accelerate launch` for DDP). Data order is a pure
function of (seed, epoch), and checkpoints hold optimizer, scheduler, RNG and data
position, so --resume continues exactly where an interrupted run stopped.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from pathlib import Path

import torch

from graft.train.batching import Batcher
from graft.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint, save_trainable
from graft.train.distributed import check_launch, global_token_loss
from graft.errors import GraftConfigError
from graft.integrity import params_digest
from graft.io import atomic_write_json, weights_sha256
from graft.run_dir import RunDir
from graft.spec import GraftSpec
from graft.train.tracking import Reporter, accelerator_kwargs, check_report_to, plot_run, trim_rows

log = logging.getLogger("graft.train.loop")


def _optimizer_steps(n_batches: int, spec: GraftSpec) -> int:
    per_epoch = math.ceil(n_batches / spec.train.grad_accum)
    return spec.train.max_steps or per_epoch * spec.train.epochs


def _build_model(spec: GraftSpec):
    from graft.model import GraftedModel

    model = GraftedModel.from_spec(spec)
    torch.manual_seed(spec.train.seed)
    if spec.train.stage == "finetune":
        from peft import LoraConfig, get_peft_model

        lc = spec.train.lora
        model.llm = get_peft_model(model.llm, LoraConfig(
            r=lc.r, lora_alpha=lc.alpha, lora_dropout=lc.dropout,
            target_modules=list(lc.target_modules), task_type="CAUSAL_LM"))
    if spec.train.gradient_checkpointing:
        model.llm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    # HF checkpointing and LoRA dropout only act in train mode; the frozen LLM's own
    # dropout rates are 0 in the supported families, so train mode changes nothing else.
    model.llm.train(spec.train.stage == "finetune" or spec.train.gradient_checkpointing)
    return model


def train(spec: GraftSpec, resume: bool = False, on_step=None) -> Path:
    """Train and return the run dir. `on_step(step, loss)` is called after each optimizer step."""
    from accelerate import Accelerator
    from transformers import get_cosine_schedule_with_warmup

    check_report_to(spec.train.report_to)
    run_dir = Path(GraftSpec.expand(spec.output_dir))
    run = RunDir(run_dir)
    llm_path = GraftSpec.expand(spec.llm.path)
    sha = weights_sha256(llm_path)
    if spec.llm.sha256 and spec.llm.sha256 != sha:
        raise GraftConfigError(
            f"llm.sha256 is {spec.llm.sha256} but the weights in {llm_path} hash to {sha}; "
            "the LLM changed since this spec was written")
    spec.llm.sha256 = sha

    accel = Accelerator(mixed_precision="bf16" if spec.train.precision == "bf16" else "no",
                        **accelerator_kwargs(spec.train.report_to, run_dir))
    check_launch(accel)
    model = _build_model(spec)
    base_digest = params_digest(model.llm)
    batcher = Batcher(spec, model, accel.process_index, accel.num_processes)
    # a resumed run, or one started from a trained adapter, keeps the stats it loaded (the
    # projector's weights were fitted to them)
    if model.projector.config.standardize and not resume and not spec.adapter_init:
        model.projector.set_feature_stats(*batcher.feature_stats())
    total_steps = _optimizer_steps(batcher.batches_per_epoch, spec)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=spec.train.lr, weight_decay=spec.train.weight_decay)
    scheduler = get_cosine_schedule_with_warmup(
        optimizer, int(spec.train.warmup_ratio * total_steps), total_steps)
    model, optimizer = accel.prepare(model, optimizer)
    core = accel.unwrap_model(model)

    step, epoch, micro = 0, 0, 0
    if resume:
        ckpt = latest_checkpoint(run_dir)
        if ckpt is None:
            raise GraftConfigError(f"--resume: no complete checkpoint under {run.checkpoints_dir}")
        state = load_checkpoint(ckpt, core, optimizer, scheduler)
        step, epoch, micro = state["step"], state["position"]["epoch"], state["position"]["micro"]
        log.info("resumed from %s at step %d", ckpt, step)
    if accel.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
        spec.save(run.spec_file)
        trim_rows(run.metrics_file, step)
        for reason in batcher.skipped:
            log.warning("skipped: %s", reason)
    reporter = Reporter(accel, spec, run_dir) if accel.is_main_process else None

    from tqdm.auto import tqdm

    bar = tqdm(total=total_steps, initial=step, desc="train", disable=not accel.is_main_process)
    accum_loss, accum_n, t0, seen = 0.0, 0, time.perf_counter(), 0
    val_seconds, val_loss, val_step, step_loss = 0.0, None, None, None
    while step < total_steps:
        batches = batcher.epoch_batches(epoch)
        while micro < len(batches) and step < total_steps:
            empty = not batches[micro]  # this rank has no sample left in the last global batch
            batch = batcher.collate(batches[micro] or [0], accel.device)
            micro += 1
            last_micro = micro % spec.train.grad_accum == 0 or micro == len(batches)
            ctx = accel.no_sync(model) if not last_micro else contextlib.nullcontext()
            with ctx, accel.autocast():
                loss = model(**batch).loss
                # several processes: the mean over the global batch's label tokens
                loss, loss_value = global_token_loss(loss, batch["labels"], accel, weight=0.0 if empty else 1.0)
                accel.backward(loss / spec.train.grad_accum)
            accum_loss += loss_value
            accum_n += 1
            seen += len(batches[micro - 1])
            if not last_micro:
                continue
            # the norm before clipping; max_grad_norm 0 measures it without clipping
            grad_norm = float(accel.clip_grad_norm_(trainable, spec.train.max_grad_norm or math.inf))
            lr = scheduler.get_last_lr()[0]  # the rate this step applies
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            step_loss = accum_loss / accum_n
            accum_loss, accum_n = 0.0, 0
            # training throughput: the time spent validating is not training
            rate = seen / max(time.perf_counter() - t0 - val_seconds, 1e-9)
            validate = batcher.val_samples and (step == total_steps or (
                spec.train.eval_every and step % spec.train.eval_every == 0))
            if validate and accel.is_main_process:
                v0 = time.perf_counter()
                val_loss, val_step = batcher.val_loss(core, accel), step
                val_seconds += time.perf_counter() - v0
            bar.update(1)
            bar.set_postfix(loss=f"{step_loss:.4f}", lr=f"{lr:.2e}", samples_s=f"{rate:.1f}",
                            **({} if val_loss is None else {"val": f"{val_loss:.4f}"}))
            log_now = step == 1 or step % spec.train.log_every == 0 or step == total_steps
            if accel.is_main_process and (log_now or validate):
                reporter.log({
                    "step": step, "epoch": epoch, "loss": step_loss, "lr": lr,
                    "grad_norm": grad_norm, "samples_per_s": rate,
                    "val_loss": val_loss if validate else None,
                    "skipped_samples": len(batcher.skipped),
                    "feature_cache_hits": batcher.cache_hits, "feature_cache_misses": batcher.cache_misses})
            position = {"epoch": epoch, "micro": micro}
            if micro == len(batches):
                position = {"epoch": epoch + 1, "micro": 0}
            if accel.is_main_process and spec.train.save_every and step % spec.train.save_every == 0:
                save_checkpoint(run_dir, step, core, optimizer, scheduler, position)
            if on_step is not None:
                on_step(step, step_loss)
        if micro >= len(batches):
            epoch, micro = epoch + 1, 0
    bar.close()
    train_s = time.perf_counter() - t0 - val_seconds

    if params_digest(core.llm) != base_digest:
        raise RuntimeError("the frozen LLM's weights changed during training; this is a bug")
    if weights_sha256(llm_path) != sha:
        raise RuntimeError(f"the LLM weight files in {llm_path} changed during training")
    if accel.is_main_process:
        save_trainable(core, run_dir)
        if not (spec.train.save_every and step % spec.train.save_every == 0):  # else saved above
            save_checkpoint(run_dir, step, core, optimizer, scheduler, {"epoch": epoch, "micro": micro})
        if spec.data.val and val_step != step:  # a resumed run that had nothing left to do
            val_loss = batcher.val_loss(core, accel)
        summary = {"steps": step, "llm_sha256": sha, "skipped_samples": len(batcher.skipped),
                   "train_samples": batcher.num_samples, "loss": step_loss,
                   "val_loss": val_loss if spec.data.val else None,
                   # this process's samples over the loop's time (validation excluded)
                   "train_seconds": train_s, "val_seconds": val_seconds,
                   "samples_per_s": seen / train_s if seen else None,
                   "feature_cache": {"hits": batcher.cache_hits, "misses": batcher.cache_misses}}
        atomic_write_json(run.train_summary, summary)
        plot_run(run_dir)
        reporter.close()
    accel.wait_for_everyone()
    return run_dir
