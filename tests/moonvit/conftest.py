"""Tiny Kimi donors shared by the moonvit tests (built once per session)."""

import pytest

from tests.moonvit.kimi_donors import build_k25_model, save_hf_names, save_k25, save_kimi_vl


@pytest.fixture(scope="session")
def kimi_model():
    return build_k25_model()


@pytest.fixture(scope="session")
def k25_dir(kimi_model, tmp_path_factory):
    return save_k25(kimi_model, tmp_path_factory.mktemp("kimi_k25"))


@pytest.fixture(scope="session")
def hf_names_dir(kimi_model, tmp_path_factory):
    return save_hf_names(kimi_model, tmp_path_factory.mktemp("kimi_k25_hf_names"))


@pytest.fixture(scope="session")
def kimi_vl_dir(k25_dir, tmp_path_factory):
    return save_kimi_vl(k25_dir, tmp_path_factory.mktemp("kimi_vl"))

