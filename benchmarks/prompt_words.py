"""The words `bench serve` builds its random prompts from, live or as a trace's stand-ins."""

from __future__ import annotations

import random

PROMPT_WORDS = ("red green blue circle square triangle left right top bottom small large "
                "what is shown in the image describe the scene count the objects").split()


def random_prompt(rng: random.Random, words: int) -> str:
    """`words` words drawn from PROMPT_WORDS with `rng`."""
    return " ".join(rng.choice(PROMPT_WORDS) for _ in range(words))
