"""Where images go in a user's text: one `<image>` marker per image, each on its own line
before the question (`<image>\\n<image>\\nQ`), as LLaVA-style data is written. `graft chat`,
`graft eval`, the server (serving/http/openai/openai_chat.py joins image and text parts with "\\n")
and the exported HF processor's chat template all build this same text, so the same images
and question give the same prompt everywhere (tests/graft/test_image_prompt.py)."""

from __future__ import annotations

IMAGE_MARKER = "<image>"


def with_image_markers(text: str, n_images: int) -> str:
    """`text` with one marker line per image in front, unless it places its markers itself."""
    if n_images and IMAGE_MARKER not in text:
        return (IMAGE_MARKER + "\n") * n_images + text
    return text
