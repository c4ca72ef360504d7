"""`graft train` keeps what a user made (no silent overwrite, resume checked against the run),
parses values strictly and checks paths before weights load: one-line errors, no traceback."""

import json
import re

import yaml

from graft.cli import main
from graft.spec import GraftSpec
from tests.graft.cli_asserts import fails as _fails


def _config(tmp_path, spec, **edits):
    raw = spec.to_dict()
    for dotted, value in edits.items():
        *parents, leaf = dotted.split(".")
        node = raw
        for part in parents:
            node = node[part]
        node[leaf] = value
    cfg = tmp_path / "spec.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    return str(cfg)




def test_run_dir_is_never_replaced_silently(make_spec, tmp_path, capsys):
    spec = make_spec(max_steps=1)
    cfg = _config(tmp_path, spec)
    run = spec.output_dir
    assert main(["train", cfg]) == 0
    first = (tmp_path / "run" / "metrics.jsonl").read_text()
    assert re.search(r"done: 1 steps in [\d.]+ min \([\d.]+ min training\), final loss [\d.]+, "
                     r"[\d.]+ samples/s, peak ",
                     capsys.readouterr().out)

    _fails(capsys, ["train", cfg], f"output_dir {run} already holds a run", "--overwrite",
           "--resume")
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == first
    # --resume with another adapter kind: named before any state_dict is touched
    changed = _config(tmp_path, spec, **{"adapter.kind": "linear", "train.lr": 0.1})
    _fails(capsys, ["train", changed, "--resume"], "--resume: the spec differs",
           "adapter.kind ('mlp' in the run, 'linear' now)", "train.lr (0.005 in the run, 0.1 now)")
    (tmp_path / "run" / "checkpoints" / "step_00000099").mkdir()  # stale, from the old run
    assert main(["train", cfg, "--overwrite"]) == 0
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 1
    assert not (tmp_path / "run" / "checkpoints" / "step_00000099").exists()
    assert main(["train", cfg, "--resume", "--set", "train.max_steps=1"]) == 0


def test_bad_data_is_named_before_the_llm_loads_or_overwrite_deletes(make_spec, tmp_path, capsys):
    import shutil

    spec = make_spec(max_steps=1)
    assert main(["train", _config(tmp_path, spec)]) == 0
    kept = sorted(p.relative_to(tmp_path) for p in (tmp_path / "run").rglob("*"))
    rows = json.loads(open(spec.data.train).read())
    rows[3]["conversations"][1]["value"] = None
    (tmp_path / "bad.json").write_text(json.dumps(rows))
    # an LLM dir whose weights cannot be read: the data's problem is still the one named
    llm = tmp_path / "llm"
    shutil.copytree(spec.llm.path, llm)
    (llm / "model.safetensors").write_bytes(b"not safetensors")
    cfg = _config(tmp_path, spec, **{"data.train": str(tmp_path / "bad.json"), "llm.path": str(llm)})
    _fails(capsys, ["train", cfg, "--overwrite"], "bad.json sample 3: conversations[1].value is null")
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "run").rglob("*")) == kept


def test_non_run_dir_and_missing_checkpoint(make_spec, tmp_path, capsys):
    spec = make_spec(max_steps=1)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("mine")
    cfg = _config(tmp_path, spec)
    _fails(capsys, ["train", cfg, "--overwrite"], "is not empty and is not a run dir")
    assert (tmp_path / "run" / "notes.txt").read_text() == "mine"
    _fails(capsys, ["train", cfg, "--resume"], "has no graft.yaml (no run was started there)")
    _fails(capsys, ["train", cfg, "--set", f"output_dir={tmp_path / 'run' / 'notes.txt'}"],
           "notes.txt is a file")


def test_strict_values(make_spec, tmp_path, capsys):
    cfg = _config(tmp_path, make_spec())
    _fails(capsys, ["train", cfg, "--set", "train.gradient_checkpointing=ture"],
           "train.gradient_checkpointing='ture': expected a boolean (true or false)")
    _fails(capsys, ["train", cfg, "--set", "train.batch_size=2.5"],
           "train.batch_size=2.5: expected an integer")
    _fails(capsys, ["train", cfg, "--set", "train.warmup_ratio=2"],
           "train.warmup_ratio=2.0: must be between 0 and 1")
    _fails(capsys, ["train", cfg, "--set", "llm.dtype=fp8"],
           "llm.dtype='fp8': use one of float32, bfloat16, float16")
    _fails(capsys, ["train", cfg, "--set", "train.lr=-1"], "train.lr=-1.0: must be > 0")


def test_paths_checked_before_weights_load(make_spec, tmp_path, capsys):
    cfg = _config(tmp_path, make_spec())
    _fails(capsys, ["train", cfg, "--set", f"llm.path={tmp_path / 'no-llm'}"],
           f"llm.path: {tmp_path / 'no-llm'} does not exist")
    _fails(capsys, ["train", cfg, "--set", f"llm.path={tmp_path}"],
           "llm.path:", "has no config.json")
    _fails(capsys, ["train", cfg, "--set", "data.val=missing-val.json"], "data.val:",
           "missing-val.json does not exist")


def test_yaml_paths_are_relative_to_its_folder(make_spec, tmp_path, monkeypatch):
    from graft.spec import GraftSpec

    spec = make_spec()
    folder = tmp_path / "configs"
    folder.mkdir()
    raw = spec.to_dict()
    raw["data"]["val"] = "val.json"
    (folder / "g.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.chdir(tmp_path)
    loaded = GraftSpec.load(folder / "g.yaml", ["data.image_root=imgs"])
    assert loaded.data.val == str(folder / "val.json")
    assert loaded.data.image_root == str(tmp_path / "imgs")  # --set: the current directory
    assert loaded.llm.path == spec.llm.path  # absolute paths stay as written


def test_dry_run_reports_without_training(make_spec, tmp_path, capsys):
    cfg = _config(tmp_path, make_spec())
    assert main(["train", cfg, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "resolved spec:" in out and "kind: mlp" in out
    assert "data.train: 12 samples (0 skipped), 12 images, image tokens per image [16]" in out
    assert "memory estimate:" in out and "GiB" in out
    assert not (tmp_path / "run").exists()


def test_a_real_process_prints_one_line(make_spec, tmp_path):
    """The whole `graft` process, not just main(): one stderr line, exit 2, no traceback."""
    import subprocess
    import sys

    import os

    cfg = _config(tmp_path, make_spec())
    # threads chosen by the caller: on a busy machine graft would otherwise say in one more
    # line how many it chose (tests/graft/test_threads.py covers that line)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "graft.cli", "train", cfg, "--set",
                           "train.gradient_checkpointing=ture"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "graft train: error: train.gradient_checkpointing='ture': expected a boolean (true or false)"]


def test_ctrl_c_keeps_the_periodic_checkpoint_and_says_how_to_resume(make_spec, tmp_path, capsys,
                                                                   monkeypatch):
    import graft.train.loop as loop

    assert GraftSpec().train.save_every > 0  # an interrupted run keeps something by default
    real_train = loop.train

    def interrupted(spec, resume=False, before_write=None):
        def ctrl_c(step, loss):
            if step == 3:
                raise KeyboardInterrupt
        return real_train(spec, resume, on_step=ctrl_c, before_write=before_write)

    monkeypatch.setattr(loop, "train", interrupted)
    cfg = _config(tmp_path, make_spec(max_steps=5, save_every=2))
    assert main(["train", cfg, "--set", "train.log_every=1"]) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert (f"step_00000002 holds step 2. Continue with: graft train {cfg} --set "
            "train.log_every=1 --resume") in err
    monkeypatch.setattr(loop, "train", real_train)
    assert main(["train", cfg, "--resume"]) == 0
    assert [r["step"] for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").open())] \
        == [1, 2, 3, 4, 5]


def test_resume_without_a_checkpoint_names_what_is_missing(make_spec, tmp_path, capsys,
                                                         monkeypatch):
    import graft.train.loop as loop

    real_train = loop.train

    def interrupted(spec, resume=False, before_write=None):
        def ctrl_c(step, loss):
            raise KeyboardInterrupt
        return real_train(spec, resume, on_step=ctrl_c, before_write=before_write)

    monkeypatch.setattr(loop, "train", interrupted)
    cfg = _config(tmp_path, make_spec(max_steps=5, save_every=4))
    assert main(["train", cfg]) == 130
    assert "interrupted before the first checkpoint (train.save_every=4)" in capsys.readouterr().err
    _fails(capsys, ["train", cfg, "--resume"], "holds a run but no complete checkpoint",
           "--overwrite")
