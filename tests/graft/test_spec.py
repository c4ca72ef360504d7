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


def test_typed_encoder_and_adapter_blocks_leave_the_mappings_as_written(tmp_path, monkeypatch):
    from graft.adapters import AdapterConfig
    from graft.encoders import EncoderConfig

    monkeypatch.setenv("CKPTS", "/models")
    spec = GraftSpec.load(write(tmp_path, BASE.replace("ckpts/siglip", "'${CKPTS}/siglip'")))
    enc, ad = spec.encoder_config(), spec.adapter_config()
    assert isinstance(enc, EncoderConfig) and isinstance(ad, AdapterConfig)
    assert (enc.kind, enc.path, enc.drop_prefix) == ("siglip", "/models/siglip", True)  # defaults filled
    assert spec.encoder_config(expand_path=False).path == "${CKPTS}/siglip"
    assert (ad.kind, ad.depth, ad.ratio) == ("mlp", 2, 2)
    enc.feature_layer = 5  # a fresh object: the spec keeps what was written
    assert spec.encoder == {"kind": "siglip", "path": "${CKPTS}/siglip", "feature_layer": -2}
    spec.save(tmp_path / "out.yaml")
    assert "drop_prefix" not in (tmp_path / "out.yaml").read_text()  # graft.yaml unchanged
    spec.adapter["depth"] = 0
    with pytest.raises(GraftConfigError, match="adapter.depth"):
        spec.adapter_config()
