"""`graft data quickstart`: write the quickstart scenes + digits as LLaVA JSON and PNGs."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from graft.quickstart.data import DataParams  # torch-free: numpy + PIL only

    parser.add_argument("--out", required=True, help="output folder (images/, train.json, eval/)")
    parser.add_argument("--seed", type=int, default=0, help="seeds scenes and train/test splits")
    d = DataParams()
    parser.add_argument("--train-scenes", type=int, default=d.train_scenes, help="synthetic training scenes")
    parser.add_argument("--val-scenes", type=int, default=d.val_scenes, help="held-out scenes")
    parser.add_argument("--digits-test", type=int, default=d.digits_test, help="held-out sklearn digits")
    parser.add_argument("--digits-train", type=int, default=d.digits_train,
                        help="training digits (0: all not held out)")
    parser.add_argument("--image-size", type=int, default=d.image_size, help="PNG side in pixels")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace what --out already holds, as a whole (refused without it)")


def run(args: argparse.Namespace) -> int:
    from graft.quickstart.data import DataParams, write_quickstart_data

    params = DataParams(seed=args.seed, train_scenes=args.train_scenes,
                        val_scenes=args.val_scenes, digits_test=args.digits_test,
                        digits_train=args.digits_train or None, image_size=args.image_size)
    from pathlib import Path

    from graft.errors import GraftConfigError
    from graft.io import atomic_write_dir, check_output_path
    from graft.quickstart.data import data_is_current, validate

    out = Path(args.out)
    validate(params)
    if data_is_current(out, params):  # the same seed and sizes: the same files
        print(f"{args.out} already holds this data (same parameters): nothing written")
        return 0
    check_output_path(out, "dir")
    if out.is_dir() and any(out.iterdir()) and not args.overwrite:
        raise GraftConfigError(f"--out {args.out} is not empty; --overwrite replaces the "
                               "quickstart data there, or pick a new folder with --out")
    meta: dict = {}
    # built in a temp dir beside --out and renamed at the end: Ctrl-C leaves no partial --out
    # that a rerun would have to --overwrite (the JSON files hold paths relative to --out)
    atomic_write_dir(out, lambda tmp: meta.update(write_quickstart_data(tmp, params)))
    evals = ", ".join(f"{k} {v}" for k, v in meta["eval"].items())
    print(f"wrote {args.out}: train.json {meta['train_samples']} samples, "
          f"val.json {meta['val_samples']}, eval: {evals}")
    return 0
