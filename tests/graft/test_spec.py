"""GraftSpec: YAML loading, --set overrides, errors that name the field."""

import pytest

from graft.errors import GraftConfigError
from graft.spec import GraftSpec

BASE = """
encoder: {kind: siglip, path: ckpts/siglip, feature_layer: -2}
adapter: {kind: mlp, depth: 2}
llm: {path: ckpts/qwen2}
data: {train: data/train.json, image_root: data/images}
train: {stage: align, lr: 1.0e-3, batch_size: 8, epochs: 1, seed: 0}
output_dir: runs/my-graft
"""


def write(tmp_path, text):
    p = tmp_path / "g.yaml"
    p.write_text(text)
    return p


def test_load_and_override(tmp_path):
    spec = GraftSpec.load(write(tmp_path, BASE), ["train.lr=1e-4", "train.lora.r=4", "adapter.depth=3"])
    assert spec.train.lr == pytest.approx(1e-4)
    assert spec.train.lora.r == 4
    assert spec.adapter == {"kind": "mlp", "depth": 3}
    assert spec.encoder["feature_layer"] == -2
    spec.save(tmp_path / "out.yaml")
    again = GraftSpec.load(tmp_path / "out.yaml")
    assert again.to_dict() == spec.to_dict()


@pytest.mark.parametrize("bad, field", [
    ("train: {stage: pretrain}", "train.stage"),
    ("train: {lrate: 1}", "train.lrate"),
    ("data: {on_bad_sample: ignore}", "data.on_bad_sample"),
    ("train: {batch_size: 0}", "train.batch_size"),
    ("train: {lr: fast}", "train.lr"),
    ("colour: red", "colour"),
])
def test_bad_fields_are_named(tmp_path, bad, field):
    with pytest.raises(GraftConfigError, match=field.replace(".", r"\.")):
        GraftSpec.load(write(tmp_path, BASE + bad + "\n"))


def test_missing_llm_path(tmp_path):
    with pytest.raises(GraftConfigError, match="llm.path"):
        GraftSpec.from_dict({"encoder": {"kind": "timm"}})


def test_missing_file(tmp_path):
    with pytest.raises(GraftConfigError, match="does not exist"):
        GraftSpec.load(tmp_path / "nope.yaml")
