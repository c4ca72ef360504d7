"""`graft data quickstart`: write the quickstart scenes + digits as LLaVA JSON and PNGs."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="output folder (images/, train.json, eval/)")
    parser.add_argument("--seed", type=int, default=0, help="seeds scenes and train/test splits")
    parser.add_argument("--train-scenes", type=int, default=1200, help="synthetic training scenes")
    parser.add_argument("--val-scenes", type=int, default=200, help="held-out scenes")
    parser.add_argument("--digits-test", type=int, default=300, help="held-out sklearn digits")
    parser.add_argument("--digits-train", type=int, default=None,
                        help="cap on training digits (default: all not held out)")
    parser.add_argument("--image-size", type=int, default=128, help="PNG side in pixels")


def run(args: argparse.Namespace) -> int:
    from graft.quickstart_data import DataParams, write_quickstart_data

    params = DataParams(seed=args.seed, train_scenes=args.train_scenes,
                        val_scenes=args.val_scenes, digits_test=args.digits_test,
                        digits_train=args.digits_train, image_size=args.image_size)
    meta = write_quickstart_data(args.out, params)
    evals = ", ".join(f"{k} {v}" for k, v in meta["eval"].items())
    print(f"wrote {args.out}: train.json {meta['train_samples']} samples, "
          f"val.json {meta['val_samples']}, eval: {evals}")
    return 0
