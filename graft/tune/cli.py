"""`graft tune TRACE --model M --slo ... --out tuned.yaml`: replay a trace against candidate
serve configurations and write the best one meeting the SLO as a `graft serve --config` file;
a change from the default only when it beats the default by more than the replays' spread.

Beside --out: tuned.state.jsonl (every measured point; a rerun resumes from it) and tuned.png
(throughput against p99 TTFT, the SLO line, the finalists' medians and spreads). Nothing meets
the SLO: no YAML, exit 1. An existing --out is refused before any replay unless --force.
"""

from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path

from graft.cli_types import number_in

EXAMPLES = """examples:
  graft tune synth --profile copy-heavy --out trace.jsonl
  graft tune trace.jsonl --model ~/.cache/graft/smollm2-135m-instruct \\
      --slo ttft_p99_ms=2000,tpot_p99_ms=150 --out tuned.yaml
  graft serve --config tuned.yaml
"""

_positive = number_in(float, low=0.0, low_open=True)
MAX_REPLAY_S = 24 * 3600.0  # one replay of the trace, arrival gaps / --speed


def add_arguments(p: argparse.ArgumentParser) -> None:
    from graft.serving.engine.engine_args import add_engine_args

    p.add_argument("trace", metavar="TRACE",
                   help="a trace file (graft serve --trace FILE, or graft tune synth)")
    p.add_argument("--model", required=True, metavar="RUN_OR_LLM_DIR",
                   help="what to serve: a run dir (images + text) or an LLM dir")
    p.add_argument("--slo", required=True, metavar="METRIC=MS,...",
                   help="bounds every request must meet together, e.g. "
                        "ttft_p99_ms=500,tpot_p99_ms=100 (ttft|tpot|e2e, p50|p90|p99|mean)")
    p.add_argument("--out", required=True, metavar="tuned.yaml",
                   help="the serve config to write (its state file and plot go beside it)")
    p.add_argument("--force", action="store_true",
                   help="overwrite --out if it exists (a rerun without it is refused)")
    p.add_argument("--quality", default=None, metavar="PARETO_JSON",
                   help="pareto.json of graft quantize: search its front's precisions too")
    p.add_argument("--max-accuracy-drop", type=number_in(float, low=0.0), default=0.01,
                   help="with --quality: keep front points within this of fp32's quality")
    p.add_argument("--speed", type=_positive, default=1.0,
                   help="replay arrivals this many times faster than recorded")
    p.add_argument("--budget-minutes", type=_positive, default=10.0,
                   help="after this, no new halving rung starts: the best so far go to the "
                        "finals (full replays)")
    p.add_argument("--candidates", type=number_in(int, low=1), default=16,
                   help="configurations in the first rung: the default, each option changed "
                        "alone, then seeded random combinations")
    p.add_argument("--requests", type=number_in(int, low=1), default=None,
                   help="use only the trace's first N requests (default: all)")
    p.add_argument("--repeats", type=number_in(int, low=2, high=100), default=3,
                   help="full replays of each finalist and the default, interleaved; their "
                        "spread is the noise a change must beat")
    p.add_argument("--search-seed", type=number_in(int, low=0), default=0,
                   help="seed of the random combinations among the candidates")
    p.add_argument("--fresh", action="store_true",
                   help="ignore the state file of an earlier tune with this --out")
    # given here: fixed for every candidate and not searched (e.g. --num-kv-blocks)
    add_engine_args(p, unset=True)


def tune(records, model, slo: dict, out: str | Path, measure, cands: list[dict],
         fingerprint: dict, fixed: dict | None = None, fresh: bool = False,
         budget_s: float | None = None, repeats: int = 3, log=print):
    """The search over `cands` with `measure(options, n) -> replay summary`; writes the state
    file, the plot and (when a finalist meets the SLO in every replay) the serve config.
    Returns the search.Outcome."""
    from graft.tune.plot import plot_points
    from graft.tune.search import successive_halving
    from graft.tune.state import PointLog, state_path

    out = Path(out)
    state = PointLog(state_path(out), fingerprint, fresh)
    if state.resumed:
        log(f"resuming: {state.resumed} points already measured in {state.path}")
    outcome = successive_halving(cands, len(records), measure, slo, state, budget_s=budget_s,
                                 repeats=repeats, log=log)
    plot_points(outcome.points, slo, outcome.finals, outcome.best, out.with_suffix(".png"))
    if outcome.best is None:
        log(f"no configuration meets the SLO {_slo_text(slo)} in every replay; wrote nothing "
            f"(every point: {state.path}, {out.with_suffix('.png')})")
        return outcome
    write_serve_config(out, model, {**(fixed or {}), **outcome.best["options"]},
                       _comment(outcome, slo))
    log(f"chosen: {outcome.best['key']}; wrote {out} (graft serve --config {out}), "
        f"{state.path}, {out.with_suffix('.png')}")
    return outcome


def write_serve_config(path: Path, model, options: dict, comment: str) -> Path:
    """A YAML file `graft serve --config` reads: the model path and the chosen options."""
    import yaml

    from graft.io import atomic_write_text

    body = yaml.safe_dump({"path": str(model), **options}, sort_keys=False)
    header = "".join(f"# {line}\n" for line in comment.splitlines())
    atomic_write_text(path, header + body)
    return path


def _comment(outcome, slo: dict) -> str:
    from graft.tune.decide import describe
    from graft.tune.search import slo_value

    def numbers(f: dict) -> str:
        s = f["summary"]  # the median replay's: the SLO's own metrics
        bounds = ", ".join(f"{k} {slo_value(s, k) or 0:.0f}" for k in slo)
        return f"{describe(f)}; median replay: {bounds}"

    replays = outcome.default["replays"]
    lines = [f"graft tune: output tokens per second of engine stepping under {_slo_text(slo)}",
             "rule: a change is chosen only when its median beats the default's by more than "
             "the largest spread (max - min) of the finalists' replays",
             f"decision: {outcome.reason}", f"chosen: {outcome.best['key']}",
             f"finalists, {replays} replays each, interleaved (tok/s while busy):"]
    return "\n".join(lines + [f"  {numbers(f)}" for f in outcome.finals])


def _slo_text(slo: dict) -> str:
    return ",".join(f"{k}={v:g}" for k, v in slo.items())


def wall_measure(model, records, fixed: dict, speed: float, log=print):
    """measure(options, n): load an engine with the options, replay the first n records in
    real time, free the engine. A configuration that cannot load counts as all failed."""
    from graft.errors import GraftError
    from graft.tune.replay import load_engine, replay, summarize

    def measure(options: dict, n: int) -> dict:
        try:
            engine = load_engine(model, {**fixed, **options})
        except GraftError as err:
            log(f"  cannot load {options}: {err}")
            return {**summarize([], 0.0, 0), "requests": n, "failed": n, "error": str(err)}
        try:
            return replay(engine, records[:n], speed=speed)
        finally:
            del engine
            gc.collect()

    return measure


def run(args: argparse.Namespace) -> int:
    from graft.digests import sha256_file
    from graft.serving.engine.config import engine_values
    from graft.tune.search import candidates, label, pareto_choices, parse_slo, search_space
    from graft.run_dir import model_dir_kind
    from graft.tune.trace import read_trace

    from graft.tune.out_path import check_out_file

    check_out_file(args.out, args.force, "tuned.yaml")  # before minutes of replays
    slo = parse_slo(args.slo)
    model = Path(args.model).expanduser()
    fixed = engine_values(args)
    records = read_trace(args.trace, context_length(model, fixed))[:args.requests]
    check_replay_span(records, args.speed, args.trace)
    quant = pareto_choices(args.quality, args.max_accuracy_drop) if args.quality else []
    images = any(r.images for r in records)
    if images and model_dir_kind(model, "--model") == "llm":  # before the model loads
        from graft.errors import GraftConfigError

        first = next(i for i, r in enumerate(records) if r.images)
        raise GraftConfigError(f"TRACE {args.trace}: request {first} has images but --model "
                               f"{model} is an LLM dir (text only); tune a run dir, or a "
                               "trace without images")
    space = search_space(fixed, images, fixed.get("device", "cpu"), quant)
    cands = candidates(space, args.candidates, args.search_seed)
    fingerprint = {"trace": sha256_file(args.trace), "requests": len(records),
                   "model": str(model.resolve()), "speed": args.speed, "repeats": args.repeats,
                   "fixed": fixed, "candidates": [label(c) for c in cands]}
    print(f"graft tune: {len(records)} requests, {len(cands)} candidates over "
          f"{', '.join(space) or 'nothing'}; SLO {_slo_text(slo)}; budget "
          f"{args.budget_minutes:g} min")
    start = time.monotonic()
    outcome = tune(records, model, slo, args.out, wall_measure(model, records, fixed, args.speed),
                   cands, fingerprint, fixed, args.fresh, args.budget_minutes * 60, args.repeats)
    print(f"{outcome.replayed} replays in {time.monotonic() - start:.0f} s")
    return 0 if outcome.best is not None else 1


def context_length(model: Path, fixed: dict) -> int:
    """Tokens one request may hold on `model`, as the engine decides: --max-model-len, else
    the LLM's max_position_embeddings (2048 when its config has none)."""
    from transformers import AutoConfig

    from graft.errors import GraftConfigError
    from graft.run_dir import RunDir, is_llm_dir, model_dir_kind

    kind = model_dir_kind(model, "--model")  # neither a run dir nor an LLM dir: it says so
    if fixed.get("max_model_len"):
        return fixed["max_model_len"]
    llm = model if kind == "llm" else Path(RunDir.open(model).load_spec().llm.path).expanduser()
    if not is_llm_dir(llm):  # a run dir whose LLM moved: one line, not transformers' OSError
        raise GraftConfigError(f"--model {model}: its llm.path {llm} is not an HF LLM dir (no "
                               "config.json); fix llm.path in its graft.yaml")
    return getattr(AutoConfig.from_pretrained(str(llm)), "max_position_embeddings", None) or 2048


def check_replay_span(records, speed: float, trace) -> None:
    """GraftConfigError when one replay of `records` would last past MAX_REPLAY_S: a replay
    keeps the recorded gaps (divided by --speed) in real time."""
    from graft.errors import GraftConfigError

    span = records[-1].arrival - records[0].arrival
    if span / speed > MAX_REPLAY_S:
        raise GraftConfigError(
            f"TRACE {trace}: its arrivals span {span:.4g} s, so one replay at --speed {speed:g} "
            f"would last {span / speed:.4g} s, over {MAX_REPLAY_S:.0f} s (a day); raise --speed, "
            "use the first requests only (--requests N), or fix the arrival times")
