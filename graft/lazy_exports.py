"""Public names of a package that load on first use (module __getattr__, PEP 562), so that
importing the package, or a light submodule of it, does not import torch."""

from __future__ import annotations

import importlib
import sys


def lazy_exports(package: str, names: dict[str, str]):
    """(__getattr__, __dir__) for `package`, whose public `names` map to defining modules."""
    namespace = vars(sys.modules[package])

    def __getattr__(name: str):
        if name in names:
            value = getattr(importlib.import_module(names[name]), name)
            namespace[name] = value  # later look-ups skip this function
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(names))

    return __getattr__, __dir__
