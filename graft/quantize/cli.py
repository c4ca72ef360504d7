"""`graft quantize MODEL --tasks T1,T2 [--max-accuracy-drop D | --target-speedup X |
--budget-bytes B] --out DIR`: per-group weight schemes measured end to end (docs/quant-search.md)."""

from __future__ import annotations

import argparse

from graft.cli_types import number_in

_positive = number_in(float, low=0.0, low_open=True)
_count = number_in(int, low=1)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from graft.quantize.evaluator import EvalSettings
    from graft.serving.engine.engine_args import add_engine_args

    d = EvalSettings()
    parser.add_argument("model", help="run dir (graft.yaml), plain HF LLM dir or GGUF file")
    parser.add_argument("--tasks", required=True, help="comma-separated eval tasks (names or YAML paths)")
    parser.add_argument("--out", required=True, help="folder for quant.json, pareto.json/.png, "
                        "evaluated.jsonl, state.json (rerun the same command to resume)")
    parser.add_argument("--schemes", default=",".join(d.schemes),
                        help="schemes to choose from (fp32 always included): fp32,bf16,int8,int4,int4-g64,int4-g32-a8,...")
    goal = parser.add_mutually_exclusive_group()
    goal.add_argument("--max-accuracy-drop", type=number_in(float, low=0.0), default=None, metavar="D",
                      help="fewest weight bytes with quality >= fp32's - D (default 0.01)")
    goal.add_argument("--target-speedup", type=_positive, default=None, metavar="X",
                      help="best quality at >= X times fp32's batch-1 decode tokens/s")
    goal.add_argument("--budget-bytes", type=_positive, default=None, metavar="B",
                      help="best quality with at most B weight bytes read per decode step")
    parser.add_argument("--granularity", default=d.granularity,
                        help="one group per: module | layer (attention, MLP) | block:N (N layers) | "
                        "auto (three blocks); the head is always its own group")
    parser.add_argument("--data-root", default=None, help="folder task data paths are relative to")
    parser.add_argument("--limit", type=_count, default=None, help="first N questions per task")
    parser.add_argument("--heldout-fraction",
                        type=number_in(float, low=0.0, high=1.0, low_open=True), default=d.heldout_fraction,
                        help="share of each task's questions the search never sees")
    parser.add_argument("--calibration", default=None,
                        help="text / .jsonl / LLaVA .json for KL (default: the run's training data)")
    parser.add_argument("--calibration-samples", type=_count, default=d.calibration_samples)
    parser.add_argument("--max-evals", type=number_in(int, low=0), default=16, help="search-phase candidates at most")
    parser.add_argument("--beam", type=_count, default=3, help="measured points expanded per step")
    parser.add_argument("--heldout-points", type=number_in(int, low=0), default=2,
                        help="front points re-scored on the held-out split besides the chosen one")
    parser.add_argument("--decode-tokens", type=_count, default=d.decode_tokens,
                        help="tokens per throughput run (batch 1, best of --decode-repeats)")
    parser.add_argument("--decode-repeats", type=_count, default=d.decode_repeats)
    parser.add_argument("--bootstrap", type=_count, default=1000, help="bootstrap resamples for CIs")
    parser.add_argument("--seed", type=int, default=0, help="split and bootstrap seed")
    # the engine every candidate runs on; the weights are the search's, the prefix cache and
    # CUDA graphs stay off (a plan swaps the linears in place)
    add_engine_args(parser, exclude=("quantization", "enable_prefix_caching", "enforce_eager",
                                     "seed"))
    parser.add_argument("--fresh", action="store_true", help="ignore an existing state.json")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def goal_from_args(args):
    from graft.quantize.pareto import Goal

    if args.target_speedup is not None:
        return Goal("speedup", args.target_speedup)
    if args.budget_bytes is not None:
        return Goal("bytes", args.budget_bytes)
    return Goal("drop", 0.01 if args.max_accuracy_drop is None else args.max_accuracy_drop)


def run(args) -> int:
    from graft.quantize.evaluator import EvalSettings
    from graft.quantize.run import quantize_search
    from graft.serving import EngineConfig

    settings = EvalSettings(granularity=args.granularity, schemes=tuple(args.schemes.split(",")),
                            heldout_fraction=args.heldout_fraction, split_seed=args.seed,
                            limit=args.limit, decode_tokens=args.decode_tokens,
                            decode_repeats=args.decode_repeats, calibration=args.calibration,
                            calibration_samples=args.calibration_samples)
    quantize_search(args.model, args.tasks, args.out, goal=goal_from_args(args),
                    data_root=args.data_root, settings=settings, max_evals=args.max_evals,
                    beam=args.beam, heldout_points=args.heldout_points, n_boot=args.bootstrap,
                    seed=args.seed, device=args.device, fresh=args.fresh,
                    progress=not args.no_progress, engine_config=EngineConfig.from_args(args))
    return 0
