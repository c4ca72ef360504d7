"""The training loop: projector only (align) or projector + LoRA (finetune), LLM frozen.

Runs on accelerate: one process (CPU or GPU), data parallel (`accelerate launch`, `torchrun`),
or with the frozen LLM sharded per decoder layer (train.sharding=fsdp, graft.train.sharding).
Data order is a pure function of (seed, epoch); checkpoints hold whole trainable tensors,
optimizer state keyed by name, scheduler, RNG and the position in global batches, so --resume
continues exactly where an interrupted run stopped, at any number of ranks.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from pathlib import Path

import torch

from graft.errors import GraftConfigError
from graft.integrity import params_digest
from graft.io import atomic_write_json, weights_sha256
from graft.run_dir import RunDir
from graft.spec import GraftSpec
from graft.train import sharding
from graft.train.batching import Batcher
from graft.train.checkpoint import (latest_checkpoint, load_newest_intact, prune_checkpoints,
                                    save_checkpoint, save_trainable)
from graft.train.distributed import check_launch, global_token_loss
from graft.train.inputs import read_inputs
from graft.train.plan import check_fits
from graft.train.progress import Progress
from graft.train.tracking import Reporter, accelerator_kwargs, check_report_to, plot_run, trim_rows

log = logging.getLogger("graft.train.loop")


def _build_model(spec: GraftSpec, image_path, llm_weights: bool = True):
    from graft.model import GraftedModel

    model = GraftedModel.from_spec(spec, llm_weights=llm_weights, image_path=image_path)
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


def _checked_llm_sha(spec: GraftSpec, llm_path: str) -> str:
    sha = weights_sha256(llm_path)
    if spec.llm.sha256 and spec.llm.sha256 != sha:
        raise GraftConfigError(
            f"llm.sha256 is {spec.llm.sha256} but the weights in {llm_path} hash to {sha}; "
            "the LLM changed since this spec was written")
    return sha


class Trainer:
    """One run: built (and resumed) by the constructor, trained by `fit`."""

    def __init__(self, spec: GraftSpec, resume: bool = False, before_write=None):
        """`before_write()` runs once the launch, the fit and every sample have passed their
        checks, before the LLM is hashed and loaded and before anything is written (graft
        train lets --overwrite remove the old run there)."""
        check_report_to(spec.train.report_to)
        self.spec, self.run_dir = spec, Path(GraftSpec.expand(spec.output_dir))
        self.run = RunDir(self.run_dir)
        self.accel = sharding.make_accelerator(
            spec, **accelerator_kwargs(spec.train.report_to, self.run_dir))
        check_launch(self.accel)
        self.sharded = sharding.is_sharded(self.accel)
        check_fits(spec, self.accel.num_processes)  # config.json only: before any weight loads
        self.rss_before_model = sharding.peak_rss()  # what the plan's bytes add to
        self.inputs = read_inputs(spec)  # a bad sample is named before the LLM loads
        if before_write is not None:
            before_write()
        self.llm_path = GraftSpec.expand(spec.llm.path)
        spec.llm.sha256 = self.sha = _checked_llm_sha(spec, self.llm_path)
        self._build(resume)
        self.step, self.epoch, self.micro = 0, 0, 0
        if resume:
            self._resume()
        self._open_run_dir()

    # ---- setup -------------------------------------------------------------------------
    def _build(self, resume: bool) -> None:
        from transformers import get_cosine_schedule_with_warmup

        spec, accel = self.spec, self.accel
        self.read_llm_weights = sharding.reads_llm_weights(accel)
        broadcast = sharding.broadcasts_llm(accel)
        model = _build_model(spec, self.inputs.image_path, llm_weights=self.read_llm_weights)
        # rank 0 holds the whole LLM until its shards reach every rank
        llm_state = model.llm.state_dict() if broadcast and accel.is_main_process else None
        self.batcher = Batcher(spec, model, self.inputs, accel.process_index, accel.num_processes)
        # a resumed run, or one started from a trained adapter, keeps the stats it loaded (the
        # projector's weights were fitted to them)
        if model.projector.config.standardize and not resume and not spec.adapter_init:
            model.projector.set_feature_stats(*self.batcher.feature_stats())
        per_epoch = math.ceil(self.batcher.batches_per_epoch / spec.train.grad_accum)
        self.total_steps = spec.train.max_steps or per_epoch * spec.train.epochs
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                      lr=spec.train.lr, weight_decay=spec.train.weight_decay)
        self.scheduler = get_cosine_schedule_with_warmup(
            optimizer, int(spec.train.warmup_ratio * self.total_steps), self.total_steps)
        if self.sharded:
            sharding.prepare_sharding(accel, model)
        self.model, self.optimizer = accel.prepare(model, optimizer)
        self.core = accel.unwrap_model(self.model)
        if broadcast:
            sharding.fill_meta_shards(self.core, llm_state, accel.device, self.optimizer)
            del llm_state
        # after prepare: FSDP replaces parameters by their shards
        self.trainable = [p for p in self.core.parameters() if p.requires_grad]
        self.base_digest = params_digest(self.core.llm)

    def _resume(self) -> None:
        ckpt, state = load_newest_intact(self.run_dir, self.core, self.optimizer, self.scheduler,
                                         log.warning)
        position = state["position"]
        saved, now = position.get("global_batch"), self.global_batch
        if saved is not None and saved != now:
            raise GraftConfigError(
                f"--resume: {ckpt.name} was trained with a global batch of {saved} samples but this "
                f"launch has {self.accel.num_processes} rank(s) x train.batch_size="
                f"{self.spec.train.batch_size} = {now}; keep the global batch (ranks x batch_size), "
                f"e.g. --set train.batch_size={max(saved // self.accel.num_processes, 1)}")
        self.step, self.epoch, self.micro = state["step"], position["epoch"], position["micro"]
        log.info("resumed from %s at step %d", ckpt, self.step)

    def _open_run_dir(self) -> None:
        self.reporter = None
        if self.accel.is_main_process:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.spec.save(self.run.spec_file)
            trim_rows(self.run.metrics_file, self.step)
            for reason in self.batcher.skipped:
                log.warning("skipped: %s", reason)
            self.reporter = Reporter(self.accel, self.spec, self.run_dir)

    @property
    def global_batch(self) -> int:
        return self.accel.num_processes * self.spec.train.batch_size

    # ---- training ------------------------------------------------------------------------
    def fit(self, on_step=None) -> Path:
        """Train to the last step; `on_step(step, loss)` after each optimizer step."""
        from tqdm.auto import tqdm

        self.progress = Progress()
        bar = tqdm(total=self.total_steps, initial=self.step, desc="train",
                   disable=not self.accel.is_main_process)
        from graft.threads import ThreadRecheck

        recheck = ThreadRecheck()  # other work that ends mid-run frees its cores for this one
        while self.step < self.total_steps:
            batches = self.batcher.epoch_batches(self.epoch)
            while self.micro < len(batches) and self.step < self.total_steps:
                if self._micro_step(batches):
                    self._optimizer_step(bar, len(batches))
                    recheck.tick()
                    if on_step is not None:
                        on_step(self.step, self.progress.step_loss)
            if self.micro >= len(batches):
                self.epoch, self.micro = self.epoch + 1, 0
        bar.close()
        self._finish()
        return self.run_dir

    def _micro_step(self, batches: list[list[int]]) -> bool:
        """Forward and backward of one micro-batch; True when an optimizer step is due."""
        spec, accel = self.spec, self.accel
        indices = batches[self.micro]
        empty = not indices  # this rank has no sample left in the last global batch
        batch = self.batcher.collate(indices or [0], accel.device)
        self.micro += 1
        last_micro = self.micro % spec.train.grad_accum == 0 or self.micro == len(batches)
        ctx = accel.no_sync(self.model) if not last_micro else contextlib.nullcontext()
        share = self.batcher.step_share(self.epoch, self.micro - 1)
        with ctx, accel.autocast():
            loss = self.model(**batch).loss
            # several processes: the mean over the global micro-batch's label tokens
            loss, value = global_token_loss(loss, batch["labels"], accel, weight=0.0 if empty else 1.0)
            # gradient accumulation: weighted by tokens, so the step's loss is the mean over
            # all of its tokens, not a mean of per-micro-batch means
            accel.backward(loss * share)
        self.progress.add_micro(value * share, len(indices))
        return last_micro

    def _optimizer_step(self, bar, n_batches: int) -> None:
        spec = self.spec
        # the norm before clipping; max_grad_norm 0 measures it without clipping
        grad_norm = float(self.accel.clip_grad_norm_(self.trainable, spec.train.max_grad_norm or math.inf))
        lr = self.scheduler.get_last_lr()[0]  # the rate this step applies
        p = self.progress
        p.end_step()
        # before the update: a non-finite loss or gradient would write NaN into the weights
        if not (math.isfinite(p.step_loss) and math.isfinite(grad_norm)):
            self._diverged(f"the loss is {p.step_loss:g} and the gradient norm {grad_norm:g}", lr)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        validate = bool(self.batcher.val_samples) and (self.step == self.total_steps or (
            spec.train.eval_every and self.step % spec.train.eval_every == 0))
        if validate:
            self._validate()
        rate = p.rate()
        bar.update(1)
        bar.set_postfix(loss=f"{p.step_loss:.4f}", lr=f"{lr:.2e}", samples_s=f"{rate:.1f}",
                        **({} if p.val_loss is None else {"val": f"{p.val_loss:.4f}"}))
        log_now = self.step == 1 or self.step % spec.train.log_every == 0 or self.step == self.total_steps
        if self.reporter is not None and (log_now or validate):
            self.reporter.log({
                "step": self.step, "epoch": self.epoch, "loss": p.step_loss, "lr": lr,
                "grad_norm": grad_norm, "samples_per_s": rate,
                "val_loss": p.val_loss if validate else None,
                "skipped_samples": len(self.batcher.skipped),
                "feature_cache_hits": self.batcher.cache_hits,
                "feature_cache_misses": self.batcher.cache_misses})
        if spec.train.save_every and self.step % spec.train.save_every == 0:
            done = self.micro == n_batches  # the epoch's last micro-batch: resume at the next
            self._save_checkpoint({"epoch": self.epoch + 1, "micro": 0} if done
                                  else {"epoch": self.epoch, "micro": self.micro})

    def _diverged(self, what: str, lr: float) -> None:
        """GraftError for a step that went non-finite: nothing of it is applied or saved, so the
        checkpoints on disk (and no final adapter) are what stays."""
        from graft.errors import GraftError

        ckpt = latest_checkpoint(self.run_dir)
        kept = (f"the newest good checkpoint {ckpt} is kept" if ckpt is not None
                else "no checkpoint was saved")
        raise GraftError(
            f"training diverged at step {self.step + 1}: {what}; nothing of this step was saved "
            f"({kept}, no adapter.safetensors written); lower train.lr (now "
            f"{self.spec.train.lr:g}, {lr:.3g} at this step) or keep gradient clipping on "
            "(train.max_grad_norm > 0), then train again with --overwrite")

    def _validate(self) -> None:
        """Validation loss; on the main process, or on every rank when the LLM is sharded
        (each rank's forward takes part in gathering the layers)."""
        if not (self.accel.is_main_process or self.sharded):
            return
        v0 = time.perf_counter()
        self.progress.val_loss, self.progress.val_step = self.batcher.val_loss(self.core, self.accel), self.step
        self.progress.val_seconds += time.perf_counter() - v0

    def _save_checkpoint(self, position: dict) -> None:
        """Every rank gathers its part of the trainable tensors and optimizer state; the main
        process writes them."""
        tensors = sharding.trainable_tensors(self.core)
        optimizer_state = sharding.optimizer_state(self.core, self.optimizer)
        if self.accel.is_main_process:
            save_checkpoint(self.run_dir, self.step, self.core, tensors, optimizer_state,
                            self.scheduler, {**position, "global_batch": self.global_batch})
            prune_checkpoints(self.run_dir, self.spec.train.keep_checkpoints)
        self.accel.wait_for_everyone()

    # ---- the end -------------------------------------------------------------------------
    def _finish(self) -> None:
        spec, accel, p = self.spec, self.accel, self.progress
        train_s = p.train_seconds()
        if params_digest(self.core.llm) != self.base_digest:
            raise RuntimeError("the frozen LLM's weights changed during training; this is a bug")
        if weights_sha256(self.llm_path) != self.sha:
            raise RuntimeError(f"the LLM weight files in {self.llm_path} changed during training")
        memory = sharding.memory_report(accel, self.core.llm, self.read_llm_weights,
                                        self.rss_before_model)
        if not (spec.train.save_every and self.step % spec.train.save_every == 0):  # else saved
            self._save_checkpoint({"epoch": self.epoch, "micro": self.micro})
        if spec.data.val and p.val_step != self.step:  # a resumed run that had nothing left to do
            self._validate()
        tensors = sharding.trainable_tensors(self.core)
        if accel.is_main_process:
            save_trainable(self.core, self.run_dir, tensors)
            summary = {"steps": self.step, "llm_sha256": self.sha,
                       "skipped_samples": len(self.batcher.skipped),
                       "train_samples": self.batcher.num_samples, "loss": p.step_loss,
                       "val_loss": p.val_loss if spec.data.val else None,
                       # this process's samples over the loop's time (validation excluded)
                       "train_seconds": train_s, "val_seconds": p.val_seconds,
                       "samples_per_s": p.seen / train_s if p.seen else None,
                       "feature_cache": {"hits": self.batcher.cache_hits,
                                         "misses": self.batcher.cache_misses},
                       "world_size": accel.num_processes, "sharding": spec.train.sharding,
                       "sharded": self.sharded, **memory}
            atomic_write_json(self.run.train_summary, summary)
            plot_run(self.run_dir)
            self.reporter.close()
        accel.wait_for_everyone()


def train(spec: GraftSpec, resume: bool = False, on_step=None, before_write=None) -> Path:
    """Train and return the run dir. `on_step(step, loss)` is called after each optimizer step;
    `before_write()` as in `Trainer`."""
    return Trainer(spec, resume, before_write).fit(on_step)
