"""Backends behind one call, `generate(requests) -> list[Result]`, and the picker from a CLI target."""

from __future__ import annotations

from pathlib import Path

from graft.errors import GraftConfigError
from graft.evals.backends.base import Request, Result
from graft.gguf_llm import model_path
from graft.run_dir import model_dir_kind

BACKEND_KINDS = ("hf", "engine")


def make_backend(target, kind: str = "hf", device: str = "cpu", quantization=None,
                 engine_config=None, **endpoint_options):
    """A ready backend from a backend object, a GraftedModel, an http(s) URL, a run dir or an LLM dir.
    quantization (a scheme or quant.json) holds the engine backend's LLM weights in low precision;
    engine_config (an EngineConfig) sets every engine option and wins over device/quantization."""
    if hasattr(target, "generate") and hasattr(target, "identity"):
        return target
    if hasattr(target, "chat") and hasattr(target, "spec"):
        from graft.evals.backends.hf import GraftedBackend

        return GraftedBackend(target)
    text = str(target)
    if text.startswith(("http://", "https://")):
        from graft.evals.backends.endpoint import EndpointBackend

        return EndpointBackend(text, **endpoint_options)
    if kind not in BACKEND_KINDS:
        raise GraftConfigError(f"--backend {kind!r}: choose one of {', '.join(BACKEND_KINDS)}")
    if quantization is not None and kind != "engine":
        raise GraftConfigError(f"--quantization {quantization} needs --backend engine (the HF backend "
                               "runs the checkpoint as saved)")
    path = model_path(Path(text).expanduser())  # a GGUF file: its LLM dir
    dir_kind = model_dir_kind(path, what="--model")
    if kind == "engine":
        from graft.evals.backends.engine import EngineBackend

        return EngineBackend(path, config=engine_config, device=device, quantization=quantization)
    if dir_kind == "run":
        from graft.evals.backends.hf import GraftedBackend

        return GraftedBackend(path, device=device)
    from graft.evals.backends.hf import PlainLLMBackend

    return PlainLLMBackend(path, device=device)


__all__ = ["BACKEND_KINDS", "Request", "Result", "make_backend"]
