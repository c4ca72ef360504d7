"""GraftSpec values parse strictly from YAML as from --set: the error names the key and what
it accepts; values YAML reads as strings (1e-4, "true") still mean what they say."""

import pytest

from graft.errors import GraftConfigError
from graft.spec import GraftSpec

BASE = {"encoder": {"kind": "timm"}, "llm": {"path": "/llm"}}


def spec(**train):
    return GraftSpec.from_dict({**BASE, "train": train})


@pytest.mark.parametrize("train, message", [
    ({"gradient_checkpointing": "ture"}, "train.gradient_checkpointing='ture': expected a boolean"),
    ({"gradient_checkpointing": 2}, "train.gradient_checkpointing=2: expected a boolean"),
    ({"batch_size": 2.5}, "train.batch_size=2.5: expected an integer"),
    ({"batch_size": True}, "train.batch_size=True: expected an integer"),
    ({"lr": "fast"}, "train.lr='fast': expected a number"),
    ({"lr": None}, "train.lr: null is not allowed"),
    ({"precision": "fp16"}, "train.precision='fp16': use one of fp32, bf16"),
    ({"warmup_ratio": 1.5}, "train.warmup_ratio=1.5: must be between 0 and 1"),
    ({"lora": {"dropout": 1.0}}, "train.lora.dropout=1.0: must be in [0, 1)"),
    ({"lora": {"target_modules": "q_proj"}}, "train.lora.target_modules='q_proj': expected a list"),
    ({"max_steps": 0}, "train.max_steps=0: must be >= 1 or null"),
    # AdamW's step at lr 1e39 overflows float32 (a RuntimeError), at 11 a run only diverges
    ({"lr": 11}, "train.lr=11.0: must be > 0 and <= 10"),
    ({"lr": 1e39}, "train.lr=1e+39: must be > 0 and <= 10"),
    ({"lr": 0.5, "weight_decay": 2}, "train.weight_decay=2 with train.lr=0.5: AdamW scales "
     "every weight by 1 - lr * weight_decay a step, so their product must be < 1"),
])
def test_wrong_values_name_key_and_choices(train, message):
    with pytest.raises(GraftConfigError) as err:
        spec(**train)
    assert message in str(err.value)


def test_strings_yaml_leaves_are_read_strictly():
    s = spec(lr="1e-4", gradient_checkpointing="true", batch_size="4", max_steps=None)
    assert s.train.lr == 1e-4 and s.train.gradient_checkpointing is True
    assert s.train.batch_size == 4 and s.train.max_steps is None
    assert spec(gradient_checkpointing="off").train.gradient_checkpointing is False
