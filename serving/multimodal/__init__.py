"""The multimodal front of the engine: image loading, the encoder cache, placing image tokens in
prompts, and the grafts an engine serves (`load_grafts`, the one loader)."""

from graft.serving.multimodal.front import MultimodalFront, generate_chats, stream_chat
from graft.serving.multimodal.grafts import GraftSet, load_grafts

__all__ = ["GraftSet", "MultimodalFront", "generate_chats", "load_grafts", "stream_chat"]
