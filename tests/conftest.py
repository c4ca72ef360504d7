"""Session fixtures: tiny random checkpoints built offline (no hub)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest

from tests.tiny_llm import LLM_FAMILIES, build_llm
from tests.vision_fixtures import *  # noqa: F401,F403


@pytest.fixture(scope="session")
def tiny_llm_factory(tmp_path_factory):
    """family -> path of a tiny random LLM dir (built once per session)."""
    made = {}

    def make(family: str = "llama"):
        if family not in made:
            made[family] = build_llm(tmp_path_factory.mktemp(f"llm_{family}"), family)
        return made[family]

    return make


@pytest.fixture(scope="session")
def tiny_llama(tiny_llm_factory):
    return tiny_llm_factory("llama")


@pytest.fixture(scope="session", params=LLM_FAMILIES)
def tiny_llm_any(request, tiny_llm_factory):
    return tiny_llm_factory(request.param)
