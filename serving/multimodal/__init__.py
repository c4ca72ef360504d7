"""The multimodal front of the engine: image loading, the encoder cache, placing image tokens in
prompts, and the grafts an engine serves."""

from graft.serving.multimodal.front import MultimodalFront, generate_chats, load_engine

__all__ = ["MultimodalFront", "generate_chats", "load_engine"]
