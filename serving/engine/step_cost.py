"""The engine's one cost model: step seconds as a function of the step's shape, fitted on
the steps the engine runs, and the encoder's seconds per image token. Admission control
(latency budgets) and `Engine.stats()` both read it.
"""

from __future__ import annotations

import math
import threading
from collections import deque

import numpy as np

MIN_STEPS = 4  # steps seen before the fit replaces the priors


class StepCostModel:
    """step seconds ~= c0 + c1 * prefill_tokens + c2 * decode_seqs, fitted on recent steps;
    encoder seconds ~= e * image_tokens (EMA). Both measured on this machine, while serving.
    The fit runs when the coefficients are read, not on every step: a batch-1 step is ~10 ms
    and refitting each one cost ~0.4 ms of it."""

    def __init__(self, window: int = 128):
        self._steps: deque[tuple[float, float, float]] = deque(maxlen=window)
        self._coef = np.array([1e-3, 1e-4, 1e-4])  # priors until real steps are seen
        self.encode_s_per_token = 1e-4
        self._encode_seen = False
        self._fitted = False
        self._stale = False  # steps observed since the last fit
        self.observed = 0  # steps seen in all (the fit uses the last `window`)
        self._lock = threading.Lock()

    def observe_step(self, prefill_tokens: int, decode_seqs: int, seconds: float) -> None:
        with self._lock:
            self._steps.append((float(prefill_tokens), float(decode_seqs), seconds))
            self.observed += 1
            self._stale = len(self._steps) >= MIN_STEPS

    def _refit(self) -> None:
        """Fit on the window if steps came since the last fit (call with the lock held)."""
        if self._stale:
            self._fit()
            self._stale, self._fitted = False, True

    def _fit(self) -> None:
        data = np.array(self._steps)  # [n, 3]: prefill tokens, decode seqs, seconds
        x = np.column_stack([np.ones(len(data)), data[:, 0], data[:, 1]])
        # A light ridge pull toward the current estimate keeps a term the window cannot
        # identify (e.g. only decode steps seen lately) where it was, not at nonsense.
        xtx = x.T @ x
        lam = 1e-2 * np.diag(xtx) + 1e-12
        coef = np.linalg.solve(xtx + np.diag(lam), x.T @ data[:, 2] + lam * self._coef)
        self._coef = np.maximum(coef, 0.0)  # costs are never negative

    def observe_encode(self, image_tokens: int, seconds: float) -> None:
        if image_tokens <= 0:
            return
        rate = seconds / image_tokens
        with self._lock:
            a = 1.0 if not self._encode_seen else 0.3
            self.encode_s_per_token = (1 - a) * self.encode_s_per_token + a * rate
            self._encode_seen = True

    @property
    def coefficients(self) -> tuple[float, float, float]:
        with self._lock:
            self._refit()
            return tuple(float(c) for c in self._coef)  # type: ignore[return-value]

    def prefill_seconds(self, tokens: int, decode_seqs: int, token_budget: int) -> float:
        """Time to push `tokens` prompt tokens through steps shared with `decode_seqs` decodes."""
        if tokens <= 0:
            return 0.0
        c0, c1, c2 = self.coefficients
        per_step = max(token_budget - decode_seqs, 1)
        steps = math.ceil(tokens / per_step)
        return steps * (c0 + c2 * decode_seqs) + c1 * tokens

    @property
    def fitted(self) -> bool:
        """Whether real steps (not only the priors) decide the coefficients."""
        with self._lock:
            self._refit()
            return self._fitted
