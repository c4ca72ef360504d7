"""`graft chat RUN_DIR --image PATH "question"`: one answer through the HF generate path."""

from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("run_dir", help="training run dir (graft.yaml + adapter.safetensors)")
    parser.add_argument("question", help="the user message; one <image> marker is added per --image "
                        "unless the text already has them")
    parser.add_argument("--image", action="append", default=[], help="image file (repeatable)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=None)


def run(args) -> int:
    from graft.train.data import load_image
    from graft.model import GraftedModel
    from graft.template import IMAGE_MARKER

    images = [load_image(p) for p in args.image]
    text = args.question
    if IMAGE_MARKER not in text:
        text = IMAGE_MARKER * len(images) + ("\n" if images else "") + text
    model = GraftedModel.from_run(args.run_dir)
    answer = model.chat([{"role": "user", "content": text}], images,
                        max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                        seed=args.seed)
    print(answer)
    return 0
