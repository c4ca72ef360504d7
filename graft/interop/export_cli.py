"""`graft export RUN_DIR OUT --format hf-llava`: a run dir as a checkpoint other engines load."""

from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("run_dir", help="run dir written by `graft train` (graft.yaml + adapter)")
    parser.add_argument("out", help="output dir (new, empty, or a previous export)")
    parser.add_argument("--format", default="hf-llava", choices=["hf-llava"],
                        help="hf-llava: transformers LlavaForConditionalGeneration + LlavaProcessor")


def run(args) -> int:
    import json

    from graft.interop.export_llava import export_llava

    print(json.dumps(export_llava(args.run_dir, args.out), indent=2))
    return 0
