"""`graft tune synth --profile chat|copy-heavy|image-burst --out trace.jsonl`: a seeded
synthetic trace (with content, so `graft tune` has prompts to replay)."""

from __future__ import annotations

import argparse

from graft.cli_types import number_in

EXAMPLES = """examples:
  graft tune synth --profile copy-heavy --out copy.jsonl --n 48
  graft tune synth --profile image-burst --out burst.jsonl --rate 8 --image-size 96
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from graft.tune.synth import PROFILES

    p.add_argument("--profile", required=True, choices=PROFILES,
                   help="chat: short questions after a shared system prompt; copy-heavy: "
                        "repeat/fix a passage; image-burst: bursts of 8 image requests")
    p.add_argument("--out", required=True, metavar="trace.jsonl")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    p.add_argument("--n", type=number_in(int, low=1), default=64, help="requests")
    p.add_argument("--seed", type=number_in(int, low=0), default=0)
    p.add_argument("--rate", type=number_in(float, low=0.0, low_open=True), default=4.0,
                   help="mean arrivals per second")
    p.add_argument("--image-size", type=number_in(int, low=8, high=4096), default=64,
                   help="image-burst: side of the square synthetic images (pixels)")


def run(args: argparse.Namespace) -> int:
    from graft.tune.out_path import check_out_file
    from graft.tune.synth import synth_trace
    from graft.tune.trace import write_trace

    check_out_file(args.out, args.force, "trace.jsonl")
    records = synth_trace(args.profile, args.n, args.seed, args.rate, args.image_size)
    write_trace(args.out, records)
    span = records[-1]["arrival"] - records[0]["arrival"]
    images = sum(len(r["images"]) for r in records)
    print(f"wrote {args.out}: {len(records)} {args.profile} requests over {span:.1f} s, "
          f"{images} images")
    return 0
