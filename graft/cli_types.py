"""argparse value types with ranges, so a bad flag is one argparse error line naming the flag,
the value and the allowed range (never a traceback from deep inside the model)."""

from __future__ import annotations

import argparse


def number_in(kind=float, low=None, high=None, low_open: bool = False):
    """A `type=` for argparse: `kind(text)` within [low, high] (`low_open`: low excluded)."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        below = low is not None and (value <= low if low_open else value < low)
        if below or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{text} is out of range: use {_wording(low, high, low_open)}")
        return value

    return parse


def _wording(low, high, low_open: bool) -> str:
    if high is None:
        return f"{'>' if low_open else '>='} {low}"
    if low is None:
        return f"<= {high}"
    return f"{low} {'<' if low_open else '<='} value <= {high}"
