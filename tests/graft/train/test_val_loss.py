"""The validation loss is the mean over every answer token, whatever the batch size."""

import json

import pytest
from accelerate import Accelerator

from graft.model import GraftedModel
from graft.train.batching import Batcher
from graft.train.inputs import read_inputs


def test_val_loss_does_not_depend_on_batching(make_spec, tiny_dataset, tmp_path):
    rows = json.loads(tiny_dataset.read_text())[:3]
    rows[0]["conversations"][1]["value"] = "red green blue yellow purple orange circle square"
    val = tmp_path / "val.json"
    val.write_text(json.dumps(rows))  # answers of 8 words and of 1
    spec = make_spec()
    spec.data.val = str(val)
    inputs = read_inputs(spec)
    model = GraftedModel.from_spec(spec, image_path=inputs.image_path)
    accel = Accelerator(cpu=True)
    got = []
    for batch_size in (1, 3):
        spec.train.batch_size = batch_size
        got.append(Batcher(spec, model, inputs).val_loss(model, accel))
    assert got[0] == pytest.approx(got[1], rel=1e-5)
