"""Turn validated samples into training batches: seeded order, frozen features, padding.

Frozen-encoder features come from the feature cache when one is configured; misses in a
batch are encoded together and stored.
"""

from __future__ import annotations

import torch

from graft.train.data import image_content_hash, load_image
from graft.train.distributed import label_tokens
from graft.errors import GraftConfigError
from graft.train.feature_cache import FeatureCache
from graft.train.inputs import TrainInputs
from graft.spec import GraftSpec
from graft.template import IGNORE_INDEX


class Batcher:
    def __init__(self, spec: GraftSpec, model, inputs: TrainInputs, rank: int = 0, world: int = 1):
        """`inputs`: the validated samples (`read_inputs`), tokenized as `model` takes them."""
        self.spec = spec
        self.model = model
        self.rank, self.world = rank, world
        self.samples, self.skipped = inputs.samples, inputs.skipped
        self.val_samples = inputs.val_samples
        self.cache = None
        if spec.train.feature_cache:
            self.cache = FeatureCache(GraftSpec.expand(spec.train.feature_cache),
                                      model.encoder.identity())
        self.pad_id = model.tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = model.tokenizer.eos_token_id or 0
        self._encoded = 0  # images run through the encoder (cache misses, or no cache)
        self._epoch_order: tuple[int | None, list[int]] = (None, [])
        # per sample, the tokens that carry loss (the first token is predicted by nothing)
        self._label_tokens = [sum(lab != IGNORE_INDEX for lab in s.chat.labels[1:])
                              for s in self.samples]

    @property
    def num_samples(self) -> int:
        return len(self.samples)

    @property
    def cache_hits(self) -> int:
        return self.cache.hits if self.cache else 0

    @property
    def cache_misses(self) -> int:
        return self.cache.misses if self.cache else self._encoded

    @property
    def batches_per_epoch(self) -> int:
        per_rank = -(-len(self.samples) // self.world)
        return -(-per_rank // self.spec.train.batch_size)

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """Sample indices of this rank's micro-batches; a pure function of (seed, epoch).
        Micro-batch k of every rank together is global batch k of a one-process run."""
        mine = self._order(epoch)[self.rank::self.world]
        bs = self.spec.train.batch_size
        batches = [mine[i:i + bs] for i in range(0, len(mine), bs)]
        # every process must take part in every step; one left without samples in the last
        # global batch gets an empty micro-batch, which the loop runs with zero weight
        return batches + [[] for _ in range(self.batches_per_epoch - len(batches))]

    def _order(self, epoch: int) -> list[int]:
        if self._epoch_order[0] != epoch:  # asked once per micro-batch: kept for the epoch
            g = torch.Generator().manual_seed(self.spec.train.seed * 1_000_003 + epoch)
            self._epoch_order = (epoch, torch.randperm(len(self.samples), generator=g).tolist())
        return self._epoch_order[1]

    def step_share(self, epoch: int, micro: int) -> float:
        """Micro-batch `micro`'s share of the label tokens of its optimizer step, all ranks
        counted: weighted by it, the step's loss is the mean over every token of its global
        batch (train.grad_accum micro-batches, fewer in an epoch's last step), as one batch
        holding them all would give. Known from the data alone: no rank has to ask another."""
        order, bs, accum = self._order(epoch), self.spec.train.batch_size, self.spec.train.grad_accum
        size = bs * self.world  # global micro-batch k is order[k * size:(k + 1) * size]

        def tokens(k: int) -> int:
            return sum(self._label_tokens[i] for i in order[k * size:(k + 1) * size])

        first = micro - micro % accum
        window = range(first, min(first + accum, self.batches_per_epoch))
        return tokens(micro) / max(sum(tokens(k) for k in window), 1)

    def features(self, images) -> list[torch.Tensor]:
        """Frozen-encoder features per image, through the cache when configured."""
        if self.cache is None:
            self._encoded += len(images)
            return self.model.encode_images(images)
        keys = [image_content_hash(im) for im in images]
        out = [self.cache.get(k) for k in keys]
        missing = [i for i, f in enumerate(out) if f is None]
        if missing:
            fresh = self.model.encode_images([images[i] for i in missing])
            for i, f in zip(missing, fresh):
                self.cache.put(keys[i], f)
                out[i] = f
        return out

    def feature_stats(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-channel mean and std (unbiased) of the frozen features over every token of
        every training image (adapter.standardize). Goes through the feature cache, so the
        first epoch then reads the features instead of encoding them again."""
        paths = list(dict.fromkeys(p for s in self.samples for p in s.image_paths))
        if not paths:
            raise GraftConfigError("adapter.standardize needs training images to measure the features "
                                   f"on, but {self.spec.data.train} has no sample with an image; "
                                   "turn adapter.standardize off for text-only data")
        from tqdm.auto import tqdm

        total = total_sq = None
        count = 0
        step = self.spec.train.batch_size
        # before step 1, and long on a cold cache: a bar says what the wait is for
        what = "reading cached features" if self.cache and self.cache.warm() else "encoding"
        bar = tqdm(total=len(paths), unit="image", disable=self.rank != 0,
                   desc=f"{what} {len(paths)} training images (adapter.standardize stats)")
        for i in range(0, len(paths), step):
            for f in self.features([load_image(p) for p in paths[i:i + step]]):
                f = f.double().reshape(-1, f.shape[-1])
                total = f.sum(0) if total is None else total + f.sum(0)
                total_sq = (f * f).sum(0) if total_sq is None else total_sq + (f * f).sum(0)
                count += f.shape[0]
            bar.update(len(paths[i:i + step]))
        bar.close()
        mean = total / count
        var = (total_sq - count * mean * mean) / max(count - 1, 1)
        return mean.float(), var.clamp(min=0).sqrt().float()

    def collate(self, indices: list[int], device, samples=None) -> dict:
        samples = [(samples or self.samples)[i] for i in indices]
        images = [load_image(p) for s in samples for p in s.image_paths]
        feats = self.features(images)
        longest = max(len(s.chat.input_ids) for s in samples)
        ids = torch.full((len(samples), longest), self.pad_id, dtype=torch.long)
        labels = torch.full((len(samples), longest), IGNORE_INDEX, dtype=torch.long)
        mask = torch.zeros((len(samples), longest), dtype=torch.long)
        for row, s in enumerate(samples):  # right padding; image rows keep their order
            n = len(s.chat.input_ids)
            ids[row, :n] = torch.tensor(s.chat.input_ids)
            labels[row, :n] = torch.tensor(s.chat.labels)
            mask[row, :n] = 1
        return {"input_ids": ids.to(device), "attention_mask": mask.to(device),
                "labels": labels.to(device), "vision_feats": feats,
                "sizes": [im.size for im in images]}

    @torch.no_grad()
    def val_loss(self, model, accel) -> float:
        """Mean loss over every answer token of the validation samples (so it does not depend
        on how they are batched), in eval mode (no LoRA dropout), leaving each module's
        train/eval mode as it was."""
        modes = [(m, m.training) for m in model.modules()]
        model.eval()
        total, n = 0.0, 0
        bs = self.spec.train.batch_size
        try:
            for i in range(0, len(self.val_samples), bs):
                idx = list(range(i, min(i + bs, len(self.val_samples))))
                batch = self.collate(idx, accel.device, samples=self.val_samples)
                with accel.autocast():
                    loss = model(**batch).loss
                tokens = int(label_tokens(batch["labels"]))
                total += loss.item() * tokens
                n += tokens
        finally:
            for m, training in modes:
                m.train(training)
        return total / max(n, 1)
