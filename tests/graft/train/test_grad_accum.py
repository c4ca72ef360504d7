"""Gradient accumulation: a step of train.grad_accum micro-batches has the loss and gradient
of one batch holding all of their samples (the mean over every answer token), also in an
epoch's last, shorter step."""

import json

import pytest

from graft.train.loop import train
from tests.graft.conftest import make_dataset


def test_accumulated_step_equals_one_big_batch(make_spec, tmp_path):
    data = make_dataset(tmp_path / "data", n=5)
    rows = json.loads(data.read_text())
    for k, row in enumerate(rows):  # answers of 1 to 9 words: micro-batch means differ
        row["conversations"][1]["value"] = " ".join(["red"] * (2 * k + 1))
    data.write_text(json.dumps(rows))
    metrics = []
    for name, batch_size, accum in (("big", 4, 1), ("accum", 2, 2)):
        spec = make_spec(max_steps=2, batch_size=batch_size, grad_accum=accum, lr=1e-3)
        spec.data.train, spec.data.image_root = str(data), str(data.parent)
        spec.output_dir = str(tmp_path / name)
        run = train(spec)
        metrics.append([json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()])
    big, accum = metrics
    for key in ("loss", "grad_norm"):  # step 2 holds the one sample left over
        assert [r[key] for r in accum] == pytest.approx([r[key] for r in big], rel=1e-5), key
