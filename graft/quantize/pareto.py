"""Goals (a constraint plus what to optimize) and the Pareto filter over measured points.

A point is a dict with `quality` (higher is better), `tokens_per_s` (higher) and
`weight_bytes` (lower), plus `complete` (False when its measurement stopped early).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from graft.errors import GraftConfigError

_EPS = 1e-9


@dataclass(frozen=True)
class Goal:
    kind: str  # "drop": fewest bytes with quality >= fp32 - value; "speedup": best quality
    # with tokens/s >= value x fp32's; "bytes": best quality with weight bytes <= value
    value: float

    def __post_init__(self):
        if self.kind not in ("drop", "speedup", "bytes"):
            raise GraftConfigError(f"goal kind {self.kind!r}: use drop, speedup or bytes")
        low_ok = self.value >= 0 if self.kind == "drop" else self.value > 0
        if not (math.isfinite(self.value) and low_ok):
            flag = {"drop": "--max-accuracy-drop", "speedup": "--target-speedup",
                    "bytes": "--budget-bytes"}[self.kind]
            raise GraftConfigError(f"{flag} must be a finite number "
                                   f"{'>= 0' if self.kind == 'drop' else '> 0'}, got {self.value}")

    def describe(self) -> str:
        return {"drop": f"fewest weight bytes with quality >= fp32 - {self.value:g}",
                "speedup": f"best quality at >= {self.value:g}x fp32 decode tokens/s",
                "bytes": f"best quality within {int(self.value)} weight bytes per token"}[self.kind]

    def violation(self, p: dict, base: dict) -> float:
        """How far p is from meeting the goal (0 = feasible), in the constraint's unit."""
        if self.kind == "drop":
            return max(0.0, base["quality"] - self.value - p["quality"] - _EPS)
        if self.kind == "speedup":
            return max(0.0, self.value * base["tokens_per_s"] - p["tokens_per_s"])
        return max(0.0, p["weight_bytes"] - self.value)

    def repaired(self, p: dict, base: dict) -> dict:
        """p with its constrained quantity moved onto the goal's bound (feasible by force)."""
        if self.kind == "drop":
            return {**p, "quality": max(p["quality"], base["quality"] - self.value)}
        if self.kind == "speedup":
            return {**p, "tokens_per_s": max(p["tokens_per_s"], self.value * base["tokens_per_s"])}
        return {**p, "weight_bytes": min(p["weight_bytes"], self.value)}

    def rank(self, p: dict, base: dict) -> tuple:
        """Sort key, smaller is better: feasible points by the objective, then the rest by
        how far they miss."""
        v = self.violation(p, base)
        if self.kind == "drop":
            return (0, p["weight_bytes"], -p["quality"]) if v == 0 else (1, v, p["weight_bytes"])
        second = -p["tokens_per_s"] if self.kind == "speedup" else p["weight_bytes"]
        return (0, -p["quality"], second) if v == 0 else (1, v, -p["quality"])


def dominates(a: dict, b: dict) -> bool:
    """a is at least as good as b on all three axes and better on one."""
    ge = (a["quality"] >= b["quality"] - _EPS and a["tokens_per_s"] >= b["tokens_per_s"]
          and a["weight_bytes"] <= b["weight_bytes"])
    gt = (a["quality"] > b["quality"] + _EPS or a["tokens_per_s"] > b["tokens_per_s"]
          or a["weight_bytes"] < b["weight_bytes"])
    return ge and gt


def pareto_front(points: list[dict]) -> list[dict]:
    """The complete points no other complete point dominates, by weight bytes."""
    done = [p for p in points if p.get("complete")]
    front = [p for p in done if not any(dominates(q, p) for q in done if q is not p)]
    return sorted(front, key=lambda p: p["weight_bytes"])


def choose(points: list[dict], goal: Goal, base: dict) -> dict:
    """The best complete point that meets the goal; otherwise a one-line error naming the
    closest one."""
    done = [p for p in points if p.get("complete")]
    best = min(done, key=lambda p: goal.rank(p, base))
    if goal.violation(best, base) > 0:
        raise GraftConfigError(f"no evaluated configuration meets the goal ({goal.describe()}); "
                               f"the closest: {describe_point(best, base)}")
    return best


def describe_point(p: dict, base: dict) -> str:
    speed = p["tokens_per_s"] / base["tokens_per_s"] if base.get("tokens_per_s") else float("nan")
    return (f"{p['key']}: quality {p['quality']:.4f} ({p['quality'] - base['quality']:+.4f} vs "
            f"fp32), {p['tokens_per_s']:.1f} tok/s ({speed:.2f}x), "
            f"{p['weight_bytes'] / 1e6:.2f} MB per token")


def interaction_summary(points: list[dict]) -> dict:
    """How far the additive prediction was off on the multi-group configurations measured to
    the end (sensitivity points equal their prediction by construction)."""
    multi = [p for p in points if p.get("complete") and p.get("predicted_quality") is not None
             and p["phase"] not in ("baseline", "sensitivity")]
    gaps = [p["quality"] - p["predicted_quality"] for p in multi]
    return {"n": len(gaps), "mean_abs_gap": sum(map(abs, gaps)) / len(gaps) if gaps else None,
            "max_gap": max(gaps, default=None), "min_gap": min(gaps, default=None),
            "cancel": sum(g > _EPS for g in gaps), "compound": sum(g < -_EPS for g in gaps)}
