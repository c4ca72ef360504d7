"""Vision encoders behind one interface (preprocess, encode, num_tokens, hidden_size).

`build_encoder(EncoderConfig(kind=...))` picks the implementation by name; torch, timm and
transformers load only when an encoder is built (or EncoderInputs/ENCODERS are touched).
"""

from graft.encoders.config import EncoderConfig
from graft.encoders.registry import build_encoder, known_kinds, register_encoder

__all__ = ["EncoderConfig", "EncoderInputs", "VisionEncoder", "ENCODERS", "build_encoder", "known_kinds",
           "register_encoder"]


def __getattr__(name: str):
    if name == "ENCODERS":
        from graft.encoders.registry import all_encoders

        return all_encoders()
    if name in ("EncoderInputs", "VisionEncoder"):
        from graft.encoders import base

        return getattr(base, name)
    raise AttributeError(f"module 'graft.encoders' has no attribute {name!r}")
