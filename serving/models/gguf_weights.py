"""The engine's side of a GGUF-backed LLM dir (graft.gguf_llm): the weights dequantized by
transformers' own GGUF reader (HF's names, its q/k un-permutation: what HF runs), and the
quantization that holds them as the file does: a linear whose GGUF blocks are Q4_0 or Q4_1
(every part of it, for packed q|k|v and gate|up) in int4-g32, which keeps those grids exactly
(graft.kernels.quant_formats.quantize); every other linear in `default`."""

from __future__ import annotations

import logging
from pathlib import Path

from graft.gguf_llm import gguf_types, gguf_weights, quiet_gguf_bar
from graft.serving.models.quant_config import QuantConfig, engine_module_name

EXACT_INT4 = ("Q4_0", "Q4_1")  # llama.cpp's 32-column blocks that int4-g32 holds exactly
INT4 = "int4-g32"
log = logging.getLogger("graft.serving")


class GGUFTensors:
    """A GGUF file's tensors under HF names, read like a safetensors handle (keys, get_tensor)."""

    def __init__(self, path: Path, hf_config):
        import torch
        from transformers import AutoModelForCausalLM
        from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(hf_config)
        with quiet_gguf_bar():
            self._tensors = load_gguf_checkpoint(str(path), return_tensors=True,
                                                 model_to_load=model)["tensors"]

    def keys(self):
        return list(self._tensors)

    def get_tensor(self, name: str):
        return self._tensors[name]


def gguf_quantization(model_dir: str | Path, default: str,
                      linears: dict[str, tuple[int, int]]) -> QuantConfig | None:
    """The file's own precision for an LLM dir `graft.gguf_llm` made (None for other dirs, or
    when no linear is in Q4_0/Q4_1): int4-g32 for the linears of `linears` (the engine's
    names) stored in those blocks, `default` for the rest. A tied head is the embedding's."""
    import dataclasses

    file = gguf_weights(model_dir)
    if file is None:
        return None
    types = gguf_types(model_dir)
    parts: dict[str, list[str]] = {}
    for name, kind in types.items():
        module = engine_module_name(name.removesuffix(".weight"))
        if module == "embed_tokens" and "lm_head.weight" not in types:
            module = "lm_head"
        if name.endswith(".weight") and module in linears:
            parts.setdefault(module, []).append(kind)
    exact = sorted(name for name, kinds in parts.items() if all(k in EXACT_INT4 for k in kinds))
    _say_what_is_widened(file.resolve().name, parts, exact, default)
    if not exact:
        return None
    stored = ", ".join(f"{sum(kinds.count(k) for kinds in parts.values())} {k}"
                       for k in EXACT_INT4 if any(k in kinds for kinds in parts.values()))
    config = QuantConfig.parse({"default": default, "modules": {name: INT4 for name in exact}})
    return dataclasses.replace(config, source=f"{file.resolve().name}'s "
                               f"{stored} weights kept exact in {INT4}, the rest {default}")


def _say_what_is_widened(file: str, parts: dict[str, list[str]], exact: list[str],
                         default: str) -> None:
    """A warning when linears stored in blocks graft holds no exact form of (Q8_0, the
    K-quants, ...) are widened to `default`: several times the file's bytes, silently."""
    widened = {k for name, kinds in parts.items() if name not in exact for k in kinds
               if k not in ("F32", "F16", "BF16")}
    if widened:
        n = sum(name not in exact and any(k in widened for k in kinds) for name, kinds in parts.items())
        log.warning("%s: %d linear%s stored in %s %s held in %s (exact, more bytes than the "
                    "file; graft holds only Q4_0/Q4_1 as they are); --quantization int8 or int4 "
                    "holds them smaller, requantized", file, n, "" if n == 1 else "s",
                    "/".join(sorted(widened)), "is" if n == 1 else "are", default)
