"""The plain answer normalizer of exact match (VQAv2's official one lives in vqa_answer.py)."""

from __future__ import annotations

import string

_ARTICLES = {"a", "an", "the"}
_PUNCT_TABLE = str.maketrans({c: " " for c in string.punctuation})


def normalize_text(text: str | None) -> str:
    """Lowercase, drop punctuation and articles, collapse whitespace ("The Red." -> "red")."""
    if text is None:
        return ""
    words = str(text).lower().translate(_PUNCT_TABLE).split()
    return " ".join(w for w in words if w not in _ARTICLES)
