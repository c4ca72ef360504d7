"""The LLM dir's tokenizer and the token ids that end a generation, found as HF does."""

from __future__ import annotations

import json
from pathlib import Path


def load_tokenizer(model_dir: Path):
    """The LLM dir's tokenizer, or None where it ships none (prompts must then be ids)."""
    if not any((model_dir / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json",
                                                    "tokenizer.model")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def eos_token_ids(model_dir: Path, hf_config, tokenizer) -> set[int]:
    """EOS ids as HF generate uses them: generation_config.json first, then config, tokenizer."""
    found = None
    gen = model_dir / "generation_config.json"
    if gen.is_file():
        found = json.loads(gen.read_text()).get("eos_token_id")
    if found is None:
        found = getattr(hf_config, "eos_token_id", None)
    if found is None and tokenizer is not None:
        found = tokenizer.eos_token_id
    if found is None:
        return set()
    return set(found) if isinstance(found, (list, tuple)) else {int(found)}
