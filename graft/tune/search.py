"""The search: candidate serve configurations, the SLO they must meet, and successive halving
over replays of a growing prefix of the trace, then full replays of the finalists and of the
default configuration (the yardstick), each several times, interleaved, decided by
graft.tune.decide (a change must beat the default by more than the replays' spread).

A candidate is a flat dict of serve options (engine options + encoder_cache_mb); {} is the
default configuration. `measure(options, n) -> summary` replays the first n records (the CLI
on a fresh engine in real time; tests with a step clock).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import re
import time
from dataclasses import dataclass

from graft.cli_types import number_in
from graft.errors import GraftConfigError

_SLO_KEY = re.compile(r"^(ttft|tpot|e2e)_(p50|p90|p99|mean)_ms$")
_bound_ms = number_in(float, low=0.0, low_open=True)


def parse_slo(text: str) -> dict[str, float]:
    """"ttft_p99_ms=500,tpot_p99_ms=100" -> {"ttft_p99_ms": 500.0, ...}."""
    slo = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not _SLO_KEY.match(key.strip()):
            raise GraftConfigError(f"--slo {part!r}: use METRIC=MS with METRIC one of "
                                   "ttft|tpot|e2e _ p50|p90|p99|mean _ms, e.g. ttft_p99_ms=500")
        try:
            slo[key.strip()] = _bound_ms(value.strip())
        except argparse.ArgumentTypeError as err:
            raise GraftConfigError(f"--slo {part!r}: {err} (a bound in ms)") from None
    if not slo:
        raise GraftConfigError("--slo is empty: give at least one bound, e.g. ttft_p99_ms=500")
    return slo


def slo_value(summary: dict, key: str) -> float | None:
    metric, stat, _ = key.split("_")
    return summary[f"{metric}_ms"][stat]


def violation(summary: dict, slo: dict[str, float]) -> float:
    """0 when every bound holds and every request completed; else how far off (ratio)."""
    if summary["failed"]:
        return math.inf
    worst = 0.0
    for key, bound in slo.items():
        value = slo_value(summary, key)
        worst = max(worst, 0.0 if value is None else value / bound - 1.0)
    return worst


def rank(summary: dict, slo: dict[str, float]) -> tuple:
    """Sort key, smaller is better: configurations meeting the SLO by capacity (output tokens
    per second of engine stepping: the replay's own tokens/s is the offered load whenever the
    engine keeps up), then the rest by how far they miss."""
    v = violation(summary, slo)
    capacity = summary["capacity_tokens_per_s"]
    return (0, -capacity) if v == 0 else (1, v, -capacity)


def search_space(fixed: dict, images: bool, device: str, quant: list[dict]) -> dict[str, list[dict]]:
    """Each searched option's alternatives to the default ({}: keep the default), as option
    dicts. Options given on the command line (`fixed`) are not searched."""
    space = {
        "speculative": [{"speculative": "ngram", "num_speculative_tokens": k} for k in (2, 4, 8)],
        "max_num_batched_tokens": [{"max_num_batched_tokens": n} for n in (256, 512, 8192)],
        # the default: 256 on CPU, the step budget elsewhere
        "max_prefill_tokens": [{"max_prefill_tokens": n}
                               for n in ((128, 1024) if device == "cpu" else (256, 1024))],
        "max_num_seqs": [{"max_num_seqs": n} for n in (8, 256)],
        "block_size": [{"block_size": 32}],
        # a bf16/int8 KV cache on CUDA needs matching activations: CPU only
        "kv_cache_dtype": [{"kv_cache_dtype": d} for d in ("bfloat16", "int8")]
        if device == "cpu" else [],
        "encoder_cache_mb": [{"encoder_cache_mb": mb} for mb in (32.0, 1024.0)] if images else [],
        "quantization": [{"quantization": q} for q in quant],
    }
    out = {}
    for name, alts in space.items():
        # a fixed option stays as given inside an alternative too (e.g. a fixed k for ngram)
        kept = [{k: v for k, v in alt.items() if k not in fixed} for alt in alts]
        kept = [alt for i, alt in enumerate(kept) if alt and alt not in kept[:i]]
        if kept and name not in fixed:
            out[name] = kept
    return out


def candidates(space: dict[str, list[dict]], n: int, seed: int = 0) -> list[dict]:
    """The default, every alternative alone (one change from the default), then seeded
    random combinations until there are `n`."""
    out = [{}] + [alt for alts in space.values() for alt in alts]
    names = list(space)
    combos = [c for c in itertools.product(*[[{}] + space[k] for k in names])
              if sum(1 for part in c if part) > 1]
    random.Random(seed).shuffle(combos)
    for combo in combos:
        if len(out) >= n:
            break
        out.append({k: v for part in combo for k, v in part.items()})
    return out[:max(n, 1)]


def label(options: dict) -> str:
    """A candidate's key: its options, sorted (a quant.json dict by its digest)."""
    if not options:
        return "default"
    parts = []
    for k in sorted(options):
        v = options[k]
        if isinstance(v, dict):
            import hashlib

            v = "quant-" + hashlib.sha256(json.dumps(v, sort_keys=True).encode()).hexdigest()[:8]
        parts.append(f"{k}={v}")
    return ",".join(parts)


@dataclass
class Outcome:
    best: dict | None  # the finalist to write (decide.finalist; the default when no change beat
    # it beyond noise); None when no finalist met the SLO in every replay
    default: dict | None  # the default configuration's finalist (decide.finalist)
    points: list[dict]  # every measured point, in order
    replayed: int  # points measured in this run (the rest came from the state file)
    finals: list[dict]  # every finalist (decide.finalist), the default first
    reason: str = ""  # the decision in one line


def successive_halving(cands: list[dict], n_records: int, measure, slo: dict, state,
                       eta: int = 3, finalists: int = 2, min_requests: int = 8,
                       budget_s: float | None = None, repeats: int = 3, log=print) -> Outcome:
    """A warm-up replay (not counted); every candidate on a short prefix, the best 1/eta on an
    eta times longer prefix, ... until `finalists` remain (or the prefix is the whole trace);
    then the finalists and the default on the whole trace `repeats` times, interleaved
    (A B C A B C: a drift of the machine's speed hits each alike), and decide.decide."""
    from graft.tune.decide import decide, describe, finalist

    start = time.monotonic()
    points: list[dict] = []
    replayed = [0]
    first = min(n_records, min_requests)

    def point(options: dict, n: int, repeat: int = 0) -> dict:
        key = label(options)
        got = state.get(key, n, repeat)
        if got is not None:  # measured before, maybe under another SLO: judged under this one
            got = {**got, "meets_slo": violation(got["summary"], slo) == 0}
        else:
            if not replayed[0]:  # the process's first replay pays for loading code and
                # weights into memory: it would count against whichever candidate came first
                log(f"warm-up: the default on the first {first} requests (not counted)")
                measure({}, first)
            summary = measure(options, n)
            got = {"key": key, "options": options, "requests": n, "repeat": repeat,
                   "summary": summary, "meets_slo": violation(summary, slo) == 0}
            state.add(got)
            replayed[0] += 1
            log(f"  {_describe(got)}")
        points.append(got)
        return got

    def over_budget() -> bool:
        return budget_s is not None and time.monotonic() - start > budget_s

    alive = list(cands)
    rungs = max(0, math.ceil(math.log(max(len(alive) / finalists, 1), eta)))
    n = min(n_records, max(min_requests, math.ceil(n_records / eta ** rungs)))
    while len(alive) > finalists and n < n_records and not over_budget():
        log(f"rung: {len(alive)} candidates on the first {n} requests")
        measured = []
        for options in alive:
            if over_budget():
                break  # rank what was measured; the unmeasured ones drop out
            measured.append(point(options, n))
        measured.sort(key=lambda p: rank(p["summary"], slo))
        keep = max(finalists, math.ceil(len(alive) / eta))
        alive = [p["options"] for p in measured[:keep]]
        n = min(n_records, n * eta)
    # out of budget: the best so far (ranked when a rung ran); else every one left
    finals = alive[:finalists] if over_budget() else alive
    finals = [{}] + [options for options in finals if options]
    log(f"finals: {len(finals)} candidates on all {n_records} requests, {repeats} replays "
        "each, interleaved")
    full = [point(options, n_records, r) for r in range(repeats) for options in finals]
    stats = [finalist([p for p in full if p["key"] == label(options)]) for options in finals]
    decision = decide(stats)
    for f in stats:
        log(f"  {describe(f)}")
    log(f"decision: {decision.reason}")
    return Outcome(decision.chosen, stats[0], points, replayed[0], stats, decision.reason)


def _describe(p: dict) -> str:
    s = p["summary"]
    mark = "meets SLO" if p["meets_slo"] else "misses SLO"
    return (f"{p['key']} @ {p['requests']} req: {s['capacity_tokens_per_s']:.1f} tok/s busy "
            f"({s['output_tokens_per_s']:.1f} over the replay), TTFT p99 "
            f"{_ms(s['ttft_ms']['p99'])}, TPOT p99 {_ms(s['tpot_ms']['p99'])}, {mark}")


def _ms(value) -> str:
    return "-" if value is None else f"{value:.0f} ms"


def pareto_choices(path, max_drop: float) -> list[dict]:
    """The quant.json dicts of the `graft quantize` Pareto front (pareto.json) whose quality
    is within `max_drop` of fp32's, fp32 itself left out (it is the default precision)."""
    from pathlib import Path

    from graft.quantize.groups import to_quant_config

    try:
        report = json.loads(Path(path).read_text())
        base, groups, front = report["baseline"]["quality"], report["groups"], report["front"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as err:
        raise GraftConfigError(f"--quality {path}: not a pareto.json written by graft quantize "
                               f"({type(err).__name__}: {err})") from None
    out = []
    for p in front:
        if p.get("key") == "fp32" or p.get("quality") is None or p.get("assignment") is None:
            continue
        if p["quality"] >= base - max_drop:
            out.append(to_quant_config(p["assignment"], groups,
                                       comment=f"graft quantize front point {p['key']}: quality "
                                               f"{p['quality']:.4f} (fp32 {base:.4f})"))
    return out
