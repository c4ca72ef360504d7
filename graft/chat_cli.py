"""`graft chat RUN_DIR --image PATH "question"`: one answer through the HF generate path, or
through graft's engine with `--quantization` (the LLM's weights in low precision)."""

from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("run_dir", help="training run dir (graft.yaml + adapter.safetensors)")
    parser.add_argument("question", help="the user message; one <image> marker is added per --image "
                        "unless the text already has them")
    parser.add_argument("--image", action="append", default=[], help="image file (repeatable)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--quantization", default=None, metavar="SCHEME|quant.json",
                        help="answer on graft's engine with the LLM's linears in fp32 | bf16 | int8 | "
                        "int4 | int4-g32/-g64/-g128, or per module from a quant.json (graft quantize)")


def run(args) -> int:
    from graft.train.data import load_image
    from graft.model import GraftedModel
    from graft.template import IMAGE_MARKER

    images = [load_image(p) for p in args.image]
    text = args.question
    if IMAGE_MARKER not in text:
        text = IMAGE_MARKER * len(images) + ("\n" if images else "") + text
    if args.quantization is not None:
        print(_engine_answer(args, text, images))
        return 0
    model = GraftedModel.from_run(args.run_dir)
    answer = model.chat([{"role": "user", "content": text}], images,
                        max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                        seed=args.seed)
    print(answer)
    return 0


def _engine_answer(args, text: str, images) -> str:
    from graft.serving import Engine, EngineConfig, SamplingParams
    from graft.serving.multimodal.front import generate_chats

    engine = Engine.from_pretrained(args.run_dir, EngineConfig(quantization=args.quantization))
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_new_tokens, seed=args.seed)
    out = generate_chats(engine, {"chat": ([{"role": "user", "content": text}], images)}, params)["chat"]
    if out.finish_reason in ("error", "internal_error"):
        from graft.errors import GraftConfigError

        raise GraftConfigError(f"graft chat: {out.error}")
    return out.text
