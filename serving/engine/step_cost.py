"""The engine's one cost model: step seconds as a function of the step's shape, fitted on
the steps the engine runs, and the encoder's seconds per image token. Admission control
(latency budgets), `Engine.stats()` and the speculation controller (what a verify step
costs against a plain decode step) all read it.
"""

from __future__ import annotations

import math
import threading
from collections import deque

import numpy as np

MIN_STEPS = 4  # steps seen before the fit replaces the priors
# decode-phase priors (seconds = a + b * rows) until such steps are seen: a verify step runs
# op by op where a plain CPU decode step is one C call, so its fixed part is larger
PLAIN_PRIOR, VERIFY_PRIOR = (4e-3, 5e-4), (5e-3, 5e-4)


def ridge_fit(x: np.ndarray, y: np.ndarray, prior: np.ndarray) -> np.ndarray:
    """Least squares of y on the columns of x with a light ridge pull toward `prior`: a term
    the data cannot identify (e.g. only decode steps seen lately) stays where it was, not at
    nonsense. Costs are never negative."""
    xtx = x.T @ x
    lam = 1e-2 * np.diag(xtx) + 1e-12
    return np.maximum(np.linalg.solve(xtx + np.diag(lam), x.T @ y + lam * prior), 0.0)


class LineFit:
    """seconds ~= a + b * rows over a window of recent steps of one kind, refitted when read."""

    def __init__(self, prior: tuple[float, float], window: int):
        self._points: deque[tuple[float, float]] = deque(maxlen=window)
        self._coef = np.array(prior, dtype=float)
        self._stale = False

    def observe(self, rows: int, seconds: float) -> None:
        self._points.append((float(rows), seconds))
        self._stale = len(self._points) >= MIN_STEPS

    def seconds(self, rows: int) -> float:
        if self._stale:
            data = np.array(self._points)
            x = np.column_stack([np.ones(len(data)), data[:, 0]])
            self._coef, self._stale = ridge_fit(x, data[:, 1], self._coef), False
        return float(self._coef[0] + self._coef[1] * rows)


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
        # decode-phase steps (no prompt chunk): plain ones by decode rows, and those that
        # verify proposals by all their rows (graft.serving.engine.spec_decode.controller)
        self._plain = LineFit(PLAIN_PRIOR, window)
        self._verify = LineFit(VERIFY_PRIOR, window)

    def observe_step(self, prefill_tokens: int, decode_seqs: int, seconds: float,
                     verify_rows: int = 0) -> None:
        """A step of `prefill_tokens` multi-token rows (prompt chunks and `verify_rows`, the
        rows of sequences verifying proposals) and `decode_seqs` one-token decodes."""
        with self._lock:
            self._steps.append((float(prefill_tokens), float(decode_seqs), seconds))
            self.observed += 1
            self._stale = len(self._steps) >= MIN_STEPS
            if prefill_tokens == verify_rows:  # a decode-phase step
                fit = self._verify if verify_rows else self._plain
                fit.observe(decode_seqs + verify_rows, seconds)

    def decode_step_seconds(self, rows: int, verifying: bool) -> float:
        """Measured seconds of a decode-phase step of `rows` token rows: a plain one (every
        row a one-token decode), or one where some sequences verify proposals."""
        with self._lock:
            return (self._verify if verifying else self._plain).seconds(rows)

    def _refit(self) -> None:
        """Fit on the window if steps came since the last fit (call with the lock held)."""
        if self._stale:
            self._fit()
            self._stale, self._fitted = False, True

    def _fit(self) -> None:
        data = np.array(self._steps)  # [n, 3]: prefill tokens, decode seqs, seconds
        x = np.column_stack([np.ones(len(data)), data[:, 0], data[:, 1]])
        self._coef = ridge_fit(x, data[:, 2], self._coef)

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

    def prefill_seconds(self, tokens: int, decode_seqs: int, token_budget: int,
                        prefill_tokens: int | None = None) -> float:
        """Time to push `tokens` prompt tokens through steps shared with `decode_seqs` decodes,
        at most `prefill_tokens` (EngineConfig.max_prefill_tokens) of them a step."""
        if tokens <= 0:
            return 0.0
        c0, c1, c2 = self.coefficients
        per_step = max(min(token_budget - decode_seqs, prefill_tokens or token_budget), 1)
        steps = math.ceil(tokens / per_step)
        return steps * (c0 + c2 * decode_seqs) + c1 * tokens

    @property
    def fitted(self) -> bool:
        """Whether real steps (not only the priors) decide the coefficients."""
        with self._lock:
            self._refit()
            return self._fitted
