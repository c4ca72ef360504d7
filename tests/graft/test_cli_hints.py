"""The friction a new user meets first: `--set key value` split in two, a mistyped config
field, and a synthetic trace written over one that exists."""

import yaml

from tests.graft.cli_asserts import fails


def _spec_file(make_spec, tmp_path, **edit):
    raw = make_spec().to_dict()
    raw["train"].update(edit)
    path = tmp_path / "graft.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_a_split_set_says_how_to_write_it(capsys, make_spec, tmp_path):
    spec = _spec_file(make_spec, tmp_path)
    fails(capsys, ["train", str(spec), "--set", "train.lr", "1e-3", "--dry-run"],
          "--set train.lr 1e-3: write it as one word, --set train.lr=1e-3")


def test_a_mistyped_field_gets_a_did_you_mean(capsys, make_spec, tmp_path):
    spec = _spec_file(make_spec, tmp_path, lrr=1e-3)
    fails(capsys, ["train", str(spec), "--dry-run"], "unknown train field(s) 'lrr'",
          "did you mean train.lr?")


def test_tune_synth_does_not_overwrite_a_trace(capsys, tmp_path):
    from graft.cli import main

    out = tmp_path / "t.jsonl"
    out.write_text("mine\n")
    fails(capsys, ["tune", "synth", "--profile", "chat", "--out", str(out), "--n", "2"],
          "exists; pass --force")
    assert out.read_text() == "mine\n"
    assert main(["tune", "synth", "--profile", "chat", "--out", str(out), "--n", "2",
                 "--force"]) == 0
    assert len(out.read_text().splitlines()) == 2
