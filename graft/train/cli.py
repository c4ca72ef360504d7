"""`graft train CONFIG [--set key=value ...] [--resume]`."""

from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("config", help="GraftSpec YAML (see README: Training a graft)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override a field, e.g. train.lr=1e-4 (repeatable)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the latest checkpoint in output_dir")


def run(args) -> int:
    import logging

    from graft.spec import GraftSpec
    from graft.train.loop import train

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    spec = GraftSpec.load(args.config, args.overrides)
    run_dir = train(spec, resume=args.resume)
    print(f"run dir: {run_dir}")
    print(f"next: graft chat {run_dir} --image PATH \"question\"   |   graft serve {run_dir}")
    return 0
