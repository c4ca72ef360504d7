"""Tiny LLaVA-format datasets and specs for the core tests."""

import json

import numpy as np
import pytest
from PIL import Image

from graft.spec import GraftSpec

COLORS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220)}


def make_dataset(root, n=12, seed=0, size=32):
    """Solid-color squares with noise; question 'What color?' answered by the color name."""
    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True, exist_ok=True)
    samples = []
    names = list(COLORS)
    for i in range(n):
        name = names[i % len(names)]
        arr = np.clip(np.array(COLORS[name]) + rng.normal(0, 12, (size, size, 3)), 0, 255)
        Image.fromarray(arr.astype("uint8")).save(root / "images" / f"{i}.png")
        samples.append({"id": f"s{i}", "image": f"images/{i}.png", "conversations": [
            {"from": "human", "value": "<image>\nWhat color?"}, {"from": "gpt", "value": name}]})
    (root / "train.json").write_text(json.dumps(samples))
    return root / "train.json"


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    return make_dataset(root)


@pytest.fixture
def make_spec(tmp_path, tiny_dataset, tiny_llama, tiny_encoder_config):
    def make(kind="siglip", llm=None, **train):
        enc = tiny_encoder_config(kind).to_dict()
        t = {"stage": "align", "lr": 5e-3, "batch_size": 4, "max_steps": 6, "seed": 0,
             "log_every": 1, "warmup_ratio": 0.0}
        t.update(train)
        return GraftSpec.from_dict({
            "encoder": enc, "adapter": {"kind": "mlp", "depth": 2},
            "llm": {"path": str(llm or tiny_llama)},
            "data": {"train": str(tiny_dataset), "image_root": str(tiny_dataset.parent),
                     "max_length": 256},
            "train": t, "output_dir": str(tmp_path / "run")})
    return make
