"""`graft export RUN_DIR OUT --format hf-llava|vllm`: a run dir as a checkpoint other engines load."""

from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("run_dir", help="run dir written by `graft train` (graft.yaml + adapter)")
    parser.add_argument("out", help="output dir (new, empty, or a previous export)")
    parser.add_argument("--format", default="hf-llava", choices=["hf-llava", "vllm"],
                        help="hf-llava: transformers LlavaForConditionalGeneration + LlavaProcessor "
                             "(clip/siglip + linear/mlp); vllm: a dir `vllm serve` loads with "
                             "graft's plugin, any encoder and projector (docs/vllm.md)")


def run(args) -> int:
    import json

    if args.format == "vllm":
        from graft.interop.export_vllm import export_vllm as export
    else:
        from graft.interop.export_llava import export_llava as export
    print(json.dumps(export(args.run_dir, args.out), indent=2))
    return 0
