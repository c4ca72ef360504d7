"""argparse value types with ranges, so a bad flag is one argparse error line naming the flag,
the value and the allowed range (never a traceback from deep inside the model)."""

from __future__ import annotations

import argparse
import math
import os


def number_in(kind=float, low=None, high=None, low_open: bool = False):
    """A `type=` for argparse: `kind(text)` within [low, high] (`low_open`: low excluded).
    NaN and infinity are refused: every comparison with NaN is false, so a range alone lets
    it through, and no flag means "unbounded" by inf."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number: use "
                                             f"{_wording(low, high, low_open)}")
        below = low is not None and (value <= low if low_open else value < low)
        if below or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{text} is out of range: use {_wording(low, high, low_open)}")
        return value

    return parse


def env_int(name: str, default: int, low: int = 1, env=None) -> int:
    """An integer environment variable (WORLD_SIZE, ...) of at least `low`, `default` when
    unset; GraftConfigError naming the variable, its value and the fix."""
    from graft.errors import GraftConfigError

    text = (os.environ if env is None else env).get(name, "").strip()
    if not text:
        return default
    try:
        return number_in(int, low=low)(text)
    except argparse.ArgumentTypeError as err:
        raise GraftConfigError(f"environment variable {name}: {err}; set it to an integer "
                               f">= {low} or unset it") from None


def _wording(low, high, low_open: bool) -> str:
    if low is None and high is None:
        return "a finite number"
    if high is None:
        return f"{'>' if low_open else '>='} {low}"
    if low is None:
        return f"<= {high}"
    return f"{low} {'<' if low_open else '<='} value <= {high}"


def torch_device(text: str) -> str:
    """A `type=` for --device: a torch device this machine has (cpu, cuda, cuda:N, mps), so a
    typo or a missing GPU is an argparse error, not a traceback once weights are loading."""
    name = text.strip().lower()
    if name == "cpu":  # the default: no torch import while parsing (a busy port is told first)
        return name
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        device = None
    if device is None or device.type not in ("cpu", "cuda", "mps"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a device; use cpu, cuda, cuda:N or mps")
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= count:
            have = f"GPUs 0..{count - 1}" if count else "no CUDA GPU"
            raise argparse.ArgumentTypeError(f"{text!r}: no such GPU here (this machine has "
                                             f"{have}); use cpu or an existing cuda:N")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise argparse.ArgumentTypeError(f"{text!r}: no such GPU here (MPS is not available); "
                                         "use cpu")
    return name
