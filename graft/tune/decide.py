"""The finals' decision: each finalist replayed several times, its median and spread of output
tokens per busy second, and the rule that keeps the default unless a change beats it by more
than this machine's measured noise.

The rule (docs/tune.md): a finalist is eligible when every one of its replays met the SLO. The
noise is the largest spread (max - min) among the finalists' replays. If the default is
eligible, a change is chosen only when its median exceeds the default's median by more than
the noise; else the default is kept ("no candidate beat the default beyond noise"). If the
default missed the SLO in a replay, the eligible finalist with the highest median is chosen.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

NO_GAIN = "no candidate beat the default beyond noise"


def finalist(points: list[dict]) -> dict:
    """One finalist's replays (same key, whole trace) summed up: `median`, `min`, `max`,
    `spread` of capacity (tok/s while busy), `meets_slo` (every replay met it), `summary` (the
    median replay's, for its latencies), `replays`, `met` (replays that met the SLO)."""
    ordered = sorted(points, key=lambda p: p["summary"]["capacity_tokens_per_s"])
    rates = [p["summary"]["capacity_tokens_per_s"] for p in ordered]
    middle = ordered[(len(ordered) - 1) // 2]
    met = sum(1 for p in points if p["meets_slo"])
    return {"key": middle["key"], "options": middle["options"], "summary": middle["summary"],
            "median": statistics.median(rates), "min": rates[0], "max": rates[-1],
            "spread": rates[-1] - rates[0], "replays": len(points), "met": met,
            "meets_slo": met == len(points)}


@dataclass
class Decision:
    chosen: dict | None  # the finalist to write (the default when nothing beat it); None: none
    # met the SLO in every replay
    reason: str  # one line: why this one
    noise: float  # the largest spread among the finalists (tok/s)


def decide(finals: list[dict]) -> Decision:
    """The rule above over `finalist()` dicts (the default's key is "default")."""
    noise = max((f["spread"] for f in finals), default=0.0)
    eligible = sorted((f for f in finals if f["meets_slo"]), key=lambda f: (-f["median"], f["key"]))
    default = next(f for f in finals if f["key"] == "default")
    if not eligible:
        return Decision(None, "no finalist met the SLO in every replay", noise)
    if not default["meets_slo"]:
        best = eligible[0]
        return Decision(best, f"the default missed the SLO in {default['replays'] - default['met']} "
                              f"of {default['replays']} replays; {best['key']} met it in every one",
                        noise)
    beyond = [f for f in eligible if f is not default and f["median"] - default["median"] > noise]
    if not beyond:
        rival = next((f for f in eligible if f is not default), None)
        best = "" if rival is None else (f"; best other: {rival['key']}, "
                                         f"{rival['median'] - default['median']:+.1f} tok/s")
        return Decision(default, f"{NO_GAIN} (spread {noise:.1f} tok/s{best})", noise)
    best = beyond[0]
    return Decision(best, f"{best['key']}: {best['median'] - default['median']:+.1f} tok/s over "
                          f"the default's median, more than the spread of {noise:.1f} tok/s", noise)


def describe(f: dict) -> str:
    """One finalist in one line: median [min-max] tok/s, spread, SLO replays."""
    return (f"{f['key']}: {f['median']:.1f} tok/s median [{f['min']:.1f}-{f['max']:.1f}], "
            f"spread {f['spread']:.1f}, met the SLO in {f['met']}/{f['replays']} replays")
