"""`graft inspect RUN_DIR|CONFIG`: components, parameters, frozen vs trainable, image tokens."""

from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("target", help="a run dir (graft.yaml inside) or a GraftSpec YAML")
    parser.add_argument("--image-size", action="append", default=[], metavar="WxH",
                        help="also report image tokens for this size (repeatable)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def inspect(target: str, sizes: list[tuple[int, int]]) -> dict:
    from pathlib import Path

    from graft.model import GraftedModel
    from graft.spec import GraftSpec

    path = Path(target)
    if path.is_dir():
        model = GraftedModel.from_run(path)
    else:
        model = GraftedModel.from_spec(GraftSpec.load(path))
    info = model.describe()
    sizes = sizes or [(224, 224)]
    info["image_tokens"] = {f"{w}x{h}": {"encoder": model.encoder.num_tokens(w, h),
                                         "llm": model.image_token_count(w, h)} for w, h in sizes}
    return info


def run(args) -> int:
    import json

    from graft.errors import GraftConfigError

    sizes = []
    for s in args.image_size:
        try:
            w, h = (int(v) for v in s.lower().split("x"))
        except ValueError:
            raise GraftConfigError(f"--image-size {s!r}: expected WxH, e.g. 224x224") from None
        if min(w, h) < 1:  # an encoder would report tokens for an image that cannot exist
            raise GraftConfigError(f"--image-size {s!r}: width and height must be >= 1 pixel, "
                                   "e.g. 224x224")
        sizes.append((w, h))
    info = inspect(args.target, sizes)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    for part in ("encoder", "projector", "llm"):
        d = info[part]
        state = "trainable" if d["trainable"] else "frozen"
        print(f"{part:<10} {d['params']:>14,d} params  ({d['trainable']:,d} trainable, {state})")
        for k, v in d.items():
            if k not in ("params", "trainable", "frozen"):
                print(f"{'':<12}{k}: {v}")
    for size, t in info["image_tokens"].items():
        print(f"image {size}: {t['encoder']} encoder tokens -> {t['llm']} LLM tokens")
    return 0
