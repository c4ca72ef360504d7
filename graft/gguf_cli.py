"""`graft models gguf FILE.gguf`: the LLM dir of a llama.cpp GGUF file (graft.gguf_llm), made
once and printed, for the commands that take an LLM dir (train, eval, quantize, tune, bench)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a GGUF file (llama.cpp's format) of a Llama, Qwen2, Qwen3 or Qwen3-MoE LLM")


def run(args: argparse.Namespace) -> int:
    from graft.errors import GraftConfigError
    from graft.gguf_llm import gguf_llm_dir, gguf_types, is_gguf_file

    if not is_gguf_file(args.file):
        why = "no such file" if not Path(args.file).expanduser().exists() else "not a .gguf file"
        raise GraftConfigError(f"{args.file}: {why}; give the path of a GGUF file")
    out = gguf_llm_dir(args.file, log=lambda msg: print(msg, file=sys.stderr))
    kinds: dict[str, int] = {}
    for joined in gguf_types(out).values():
        for kind in joined.split("+"):  # a MoE layer's gate and up experts: two GGUF tensors
            kinds[kind] = kinds.get(kind, 0) + 1
    print(f"{args.file}: " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) + " tensors",
          file=sys.stderr)
    print(out)
    return 0
