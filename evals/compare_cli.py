"""`graft eval compare RUN_A RUN_B`: per-task deltas (B - A) of two `graft eval --out` folders,
each with a paired bootstrap CI. A subcommand of its own, so `--help` shows its options."""

from __future__ import annotations

EXAMPLES = """example:
  graft eval compare runs/eval/base runs/eval/tuned --out runs/eval/compare
"""


def add_arguments(parser) -> None:
    parser.add_argument("run_a", metavar="RUN_A", help="the baseline: a `graft eval --out` folder")
    parser.add_argument("run_b", metavar="RUN_B", help="the one compared with it (deltas are B - A)")
    parser.add_argument("--out", default=None, help="also write compare.json into this folder")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace compare.json in an --out folder that already has one")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    parser.add_argument("--bootstrap", type=int, default=1000,
                        help="bootstrap resamples for CIs (0: no CI)")


def run(args) -> int:
    from pathlib import Path

    from graft.errors import GraftConfigError
    from graft.evals.compare import compare_runs, compare_table
    from graft.evals.report import check_out_dir
    from graft.io import atomic_write_json

    if args.out:  # checked before anything is read or computed
        check_out_dir(args.out)
        if (Path(args.out) / "compare.json").exists() and not args.overwrite:
            raise GraftConfigError(f"--out {args.out} already holds compare.json; --overwrite "
                                   "replaces it, or give another --out")
    report = compare_runs(args.run_a, args.run_b, n_boot=args.bootstrap, seed=args.seed)
    print(compare_table(report))
    if args.out:
        atomic_write_json(Path(args.out) / "compare.json", report)
        print(f"wrote {args.out}/compare.json")
    return 0
