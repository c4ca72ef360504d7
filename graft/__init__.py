"""graft: join a vision encoder to a frozen LLM through a trainable projector.

Kept import-light on purpose: subpackages (graft.kernels, graft.encoders, ...) import
`graft` first, so nothing heavy may load here.
"""

__version__ = "0.1.0"
