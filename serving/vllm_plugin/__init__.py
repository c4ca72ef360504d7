"""vLLM plugin: serve a graft exported with `graft export RUN OUT --format vllm` on vLLM.

vLLM calls `register` at start-up in every process (the `vllm.general_plugins` entry point in
pyproject.toml). Registration is by import string, so importing this package never imports
vllm or torch: graft's own venv has no vllm at all.
"""

from __future__ import annotations

ARCHITECTURE = "GraftForConditionalGeneration"


def register() -> None:
    from vllm import ModelRegistry

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(
            ARCHITECTURE, "graft.serving.vllm_plugin.model:GraftForConditionalGeneration")
