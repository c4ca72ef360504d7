"""Quickstart fixtures: the real weights, prepared once through the demo's own set-up."""

import shutil

import pytest

from graft.quickstart.models import ENCODER_NAME, PINS, prepare_models, resolve_cache_dir


@pytest.fixture(scope="session")
def quickstart_models():
    """model_paths() of the shared cache ($GRAFT_CACHE or ~/.cache/graft), as `make demo` uses."""
    return prepare_models(resolve_cache_dir(None))


@pytest.fixture(scope="session")
def wheels_dir(quickstart_models):
    """The folder holding both pinned wheels (a local --find-links source: no network)."""
    return resolve_cache_dir(None) / "wheels"


@pytest.fixture()
def encoder_cache(tmp_path, wheels_dir):
    """A fresh cache folder that already holds the efficientnet wheel (so nothing downloads)."""
    cache = tmp_path / "cache"
    (cache / "wheels").mkdir(parents=True)
    name = PINS[ENCODER_NAME].filename
    shutil.copy(wheels_dir / name, cache / "wheels" / name)
    return cache
