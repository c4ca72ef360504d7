"""Decoder families the engine runs itself, a registry by config.json, and the weight loader."""

from graft.serving.models.loader import load_weights
from graft.serving.models.registry import ARCHITECTURES, build_model, resolve_architecture

__all__ = ["ARCHITECTURES", "build_model", "load_weights", "resolve_architecture"]
