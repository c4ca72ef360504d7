"""A run's running counters: the loss of each optimizer step (the mean over its micro-batches),
samples seen, and the training time with validation left out."""

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
        self._loss, self._n = 0.0, 0

    def add_micro(self, loss: float, samples: int) -> None:
        self._loss += loss
        self._n += 1
        self.seen += samples

    def end_step(self) -> None:
        self.step_loss = self._loss / self._n
        self._loss, self._n = 0.0, 0

    def train_seconds(self) -> float:
        return time.perf_counter() - self.t0 - self.val_seconds

    def rate(self) -> float:
        """Samples per second of training (the time spent validating is not training)."""
        return self.seen / max(self.train_seconds(), 1e-9)
