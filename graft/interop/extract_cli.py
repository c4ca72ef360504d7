"""`graft extract DONOR_DIR OUT_DIR --part vision|projector|both`: take parts out of a VLM."""

from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("donor", help="local Kimi-K2.5, Kimi-VL or HF Llava checkpoint dir")
    parser.add_argument("out", help="output dir: OUT/vision (encoder dir), OUT/projector (adapter dir)")
    parser.add_argument("--part", default="both", choices=["vision", "projector", "both"],
                        help="what to extract (default both)")
    parser.add_argument("--target-llm", default=None,
                        help="HF LLM dir: re-make the projector's last Linear for its width "
                             "(donor pre-norm + first Linear kept); train it with graft train")
    parser.add_argument("--seed", type=int, default=0, help="init seed of the re-made Linear")


def run(args) -> int:
    import json

    from graft.interop.extract import extract

    summary = extract(args.donor, args.out, args.part, args.target_llm, args.seed)
    print(json.dumps({k: summary[k] for k in ("encoder", "adapter", "shards_read") if k in summary},
                     indent=2))
    return 0
