"""`graft extract DONOR_DIR OUT_DIR --part vision|projector|both`: take parts out of a VLM."""

from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("donor", help="local Kimi-K2.5, Kimi-VL or HF Llava checkpoint dir")
    parser.add_argument("out", help="output dir: OUT/vision (encoder dir), OUT/projector (adapter dir)")
    parser.add_argument("--part", default="both", choices=["vision", "projector", "both"],
                        help="what to extract (default both)")


def run(args) -> int:
    import json

    from graft.extract import extract

    summary = extract(args.donor, args.out, args.part)
    print(json.dumps({k: summary[k] for k in ("encoder", "adapter", "shards_read") if k in summary},
                     indent=2))
    return 0
