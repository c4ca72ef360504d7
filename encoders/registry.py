"""kind -> encoder class. Built-in kinds are imported on first use so `graft --help` stays light."""

from __future__ import annotations

import importlib
from typing import Any

from graft.encoders.config import EncoderConfig
from graft.errors import GraftConfigError

# kind -> module that calls register_encoder(kind, cls) when imported.
BUILTIN_KINDS: dict[str, str] = {
    "timm": "graft.encoders.timm_encoder",
    "siglip": "graft.encoders.hf_tower",
    "clip": "graft.encoders.hf_tower",
    "moonvit": "graft.encoders.moonvit",
}

_REGISTRY: dict[str, type] = {}


def register_encoder(kind: str, cls: type | None = None):
    """Register `cls` under `kind`; usable as `@register_encoder("name")` too."""

    def add(c: type) -> type:
        _REGISTRY[kind] = c
        return c

    return add(cls) if cls is not None else add


def known_kinds() -> list[str]:
    return sorted(set(_REGISTRY) | set(BUILTIN_KINDS))


def _import_kind(kind: str) -> None:
    module = BUILTIN_KINDS[kind]
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name != module:  # a real missing dependency inside the module: let it surface
            raise
        raise GraftConfigError(f"encoder.kind {kind!r} is not available in this install ({module} is missing)") from err


def all_encoders() -> dict[str, type]:
    """The registry with every importable built-in kind loaded."""
    for kind in BUILTIN_KINDS:
        if kind not in _REGISTRY:
            try:
                _import_kind(kind)
            except GraftConfigError:
                pass
    return _REGISTRY


def build_encoder(config: EncoderConfig | dict[str, Any]):
    """A frozen, eval-mode encoder on CPU in fp32 (move it with `.to(device, dtype)`)."""
    cfg = config if isinstance(config, EncoderConfig) else EncoderConfig.from_dict(config)
    cfg.validate()
    if cfg.kind not in _REGISTRY:
        if cfg.kind not in BUILTIN_KINDS:
            raise GraftConfigError(f"unknown encoder.kind {cfg.kind!r}; known kinds: {', '.join(known_kinds())}")
        _import_kind(cfg.kind)
    encoder = _REGISTRY[cfg.kind](cfg)
    return encoder.freeze()
