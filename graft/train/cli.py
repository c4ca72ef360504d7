"""`graft train CONFIG [--set key=value ...] [--resume | --overwrite] [--dry-run]`."""

from __future__ import annotations

EXAMPLES = """examples:
  graft train my-graft.yaml
  graft train my-graft.yaml --set train.lr=1e-4 --set output_dir=runs/lr1e-4
  graft train my-graft.yaml --dry-run        # check everything, load no LLM weights
  graft train my-graft.yaml --resume         # continue the run in output_dir

Relative paths in the YAML file are relative to its folder; --set paths and output_dir
to the current directory."""


def add_arguments(parser) -> None:
    parser.add_argument("config", help="GraftSpec YAML (see docs/training.md)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override a field, e.g. train.lr=1e-4 (repeatable)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true",
                      help="continue from the latest checkpoint in output_dir (same spec)")
    mode.add_argument("--overwrite", action="store_true",
                      help="replace the run already in output_dir (refused without it)")
    parser.add_argument("--dry-run", action="store_true",
                        help="validate spec, paths and data, print the resolved spec, data "
                        "counts, image tokens and a memory estimate; train nothing")


def run(args) -> int:
    import logging

    from graft.spec import GraftSpec
    from graft.spec_paths import check_paths
    from graft.train.run_guard import prepare_run_dir

    spec = GraftSpec.load(args.config, args.overrides)
    check_paths(spec)  # every input path, before any weights load
    if args.dry_run:
        from graft.train.dry_run import dry_run, format_report

        if not args.overwrite:  # the run dir check too; --overwrite would empty it
            prepare_run_dir(spec, resume=args.resume)
        print(format_report(dry_run(spec)))
        return 0
    prepare_run_dir(spec, resume=args.resume, overwrite=args.overwrite)
    from graft.train.loop import train

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    run_dir = train(spec, resume=args.resume)
    print(f"run dir: {run_dir}")
    print(f"next: graft chat {run_dir} --image PATH \"question\"   |   graft serve {run_dir}")
    return 0
