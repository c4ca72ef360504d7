"""A run's running counters: the loss of each optimizer step (the sum of its micro-batches'
token-weighted shares), samples seen, and the training time with validation left out."""

from __future__ import annotations

import time


class Progress:
    def __init__(self):
        self.t0 = time.perf_counter()
        self.seen = 0  # samples this process trained on since the start (or resume)
        self.val_seconds = 0.0
        self.val_loss: float | None = None
        self.val_step: int | None = None
        self.step_loss: float | None = None
        self._loss = 0.0

    def add_micro(self, loss_share: float, samples: int) -> None:
        """`loss_share`: the micro-batch's loss times its share of the step's label tokens."""
        self._loss += loss_share
        self.seen += samples

    def end_step(self) -> None:
        self.step_loss = self._loss
        self._loss = 0.0

    def train_seconds(self) -> float:
        return time.perf_counter() - self.t0 - self.val_seconds

    def rate(self) -> float:
        """Samples per second of training (the time spent validating is not training)."""
        return self.seen / max(self.train_seconds(), 1e-9)
