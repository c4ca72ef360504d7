"""`graft train CONFIG [--set key=value ...] [--resume | --overwrite] [--dry-run]`."""

from __future__ import annotations

import errno
import os
import sys

EXAMPLES = """examples:
  graft train my-graft.yaml
  graft train my-graft.yaml --set train.lr=1e-4 --set output_dir=runs/lr1e-4
  graft train my-graft.yaml --dry-run        # check everything, load no LLM weights
  graft train my-graft.yaml --resume         # continue the run in output_dir
  graft train my-graft.yaml --plan --world-size 8 --device-memory 80GiB
                                             # bytes per rank, DDP vs FSDP: config.json only
  graft train my-graft.yaml --plan --json    # the same plan as JSON
  accelerate launch --num_processes 8 -m graft.cli train my-graft.yaml --set train.sharding=fsdp

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
    parser.add_argument("--plan", action="store_true",
                        help="print the memory each rank needs with sharding none (DDP) and fsdp, "
                        "read from config.json files only (no weights, no data); train nothing")
    parser.add_argument("--world-size", type=_world_size, default=None,
                        metavar="N", help="ranks to plan for (default: $WORLD_SIZE, else 1)")
    parser.add_argument("--json", action="store_true",
                        help="with --plan: the plan as one JSON object (bytes), for scripts")
    parser.add_argument("--device-memory", default=None, metavar="SIZE",
                        help="memory of one rank to plan against, e.g. 80GiB (default: "
                        "train.device_memory, else this machine's)")


def _world_size(text: str) -> int:
    # plan.py imports torch: loaded when the flag is given, not for --help
    from graft.cli_types import number_in
    from graft.train.plan import MAX_WORLD_SIZE

    return number_in(int, 1, MAX_WORLD_SIZE)(text)


def run(args) -> int:
    import logging
    import time

    from graft.spec import GraftSpec
    from graft.spec_paths import check_paths
    from graft.train.run_guard import check_run_dir, clear_replaced
    from graft.train.tracking import check_report_to

    # under `accelerate launch` every process runs this: the run dir is checked (and emptied
    # with --overwrite) by the main one only, which no other may race
    main_process = os.environ.get("RANK", "0") == "0"
    spec = GraftSpec.load(args.config, args.overrides)
    if args.plan:
        return print_plan(spec, args)
    if args.json:
        from graft.errors import GraftConfigError

        raise GraftConfigError("--json goes with --plan (the plan as JSON); drop it or add --plan")
    check_paths(spec)  # every input path, before any weights load
    if spec.train.feature_cache:  # and the one output folder besides output_dir
        from graft.train.feature_cache import check_cache_root

        check_cache_root(GraftSpec.expand(spec.train.feature_cache))
    check_report_to(spec.train.report_to)  # and the tracker's package
    if args.dry_run:
        from graft.train.dry_run import dry_run, format_report

        from graft.train.run_guard import describe_run_dir, plan_run_dir

        # what the real run would do with output_dir, said and not done (nothing is deleted)
        where = describe_run_dir(*plan_run_dir(spec, args.resume, args.overwrite))
        print(format_report(dry_run(spec)))
        print(where)
        return 0
    replace = None
    if main_process:
        checked = check_run_dir(spec, resume=args.resume, overwrite=args.overwrite)

        def replace():  # --overwrite: only once every sample has passed its checks
            clear_replaced(*checked)
    from graft.train.loop import train

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    start = time.perf_counter()
    try:
        run_dir = train(spec, resume=args.resume, before_write=replace)
    except KeyboardInterrupt:  # Ctrl-C: where the run stands, not a traceback
        if main_process:
            print(interrupted_message(spec, args.config, args.overrides), file=sys.stderr)
        return 130
    except OSError as err:
        if err.errno not in DISK_ERRNOS:
            raise
        from graft.errors import GraftError

        # every write is atomic (graft.io): what failed left no half-written file behind
        raise GraftError(f"writing the run to {spec.output_dir} failed: {os.strerror(err.errno)}"
                         f"{f' ({err.filename})' if err.filename else ''}; free space (or pick "
                         "another output_dir), then --resume continues from the newest "
                         "complete checkpoint") from None
    if main_process:
        print(summary_line(run_dir, time.perf_counter() - start))
    print(f"run dir: {run_dir}")
    print(f"next: graft chat {run_dir} --image PATH \"question\"   |   graft serve {run_dir}")
    return 0


DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG)  # the disk refuses


def interrupted_message(spec, config: str, overrides: list[str] = ()) -> str:
    """What Ctrl-C kept: the newest checkpoint and the command that continues from it."""
    import shlex
    from pathlib import Path

    from graft.spec import GraftSpec
    from graft.train.checkpoint import latest_checkpoint

    command = " ".join(shlex.quote(a) for a in ["graft", "train", config,
                                                *(x for o in overrides for x in ("--set", o))])
    ckpt = latest_checkpoint(Path(GraftSpec.expand(spec.output_dir)))
    if ckpt is None:
        return (f"graft train: interrupted before the first checkpoint (train.save_every="
                f"{spec.train.save_every}); nothing to resume: `{command} --overwrite` starts again")
    step = int(ckpt.name.split("_")[-1])
    return f"graft train: interrupted; {ckpt} holds step {step}. Continue with: {command} --resume"


def print_plan(spec, args) -> int:
    from graft.cli_types import env_int
    from graft.train.plan import default_device_memory, format_plan, make_plan, parse_bytes

    world = args.world_size or env_int("WORLD_SIZE", 1)  # a typo in the env: one line
    memory = parse_bytes(args.device_memory) if args.device_memory else default_device_memory(spec)
    plan = make_plan(spec, world, memory)
    if args.json:
        import json

        print(json.dumps(plan, indent=1))
    else:
        print(format_plan(plan))
    return 0


def summary_line(run_dir, seconds: float) -> str:
    """One line when training ends: steps, wall time, final train loss, val loss, samples/s,
    peak memory (from train_summary.json, which the loop wrote)."""
    import json
    import resource

    import torch

    summary = json.loads((run_dir / "train_summary.json").read_text())
    parts = [f"done: {summary['steps']} steps in {seconds / 60:.1f} min"]
    if summary.get("train_seconds") is not None:
        parts[0] += f" ({summary['train_seconds'] / 60:.1f} min training)"
    if summary.get("loss") is not None:
        parts.append(f"final loss {summary['loss']:.4f}")
    if summary.get("val_loss") is not None:
        parts.append(f"val loss {summary['val_loss']:.4f}")
    if summary.get("samples_per_s") is not None:
        parts.append(f"{summary['samples_per_s']:.1f} samples/s")
    if torch.cuda.is_available():
        parts.append(f"peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")
    else:  # ru_maxrss is in KiB on Linux
        parts.append(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")
    return ", ".join(parts)
