"""Watching a run: periodic validation, a metrics row from step 1, the plot, train.report_to
(TensorBoard read back with its own EventAccumulator) and strict values for the new fields."""

import json

import pytest
from PIL import Image

from graft.errors import GraftConfigError
from graft.train.loop import train
from graft.train.tracking import read_rows, smooth


@pytest.fixture
def val_json(tmp_path, tiny_dataset):
    """Four of the training samples with absolute image paths, as a held-out file."""
    samples = json.loads(tiny_dataset.read_text())[:4]
    for s in samples:
        s["image"] = str(tiny_dataset.parent / s["image"])
    path = tmp_path / "val.json"
    path.write_text(json.dumps(samples))
    return str(path)


def test_periodic_validation_leaves_training_unchanged(make_spec, val_json, tmp_path):
    plain = make_spec(max_steps=6, lr=2e-2)
    plain.output_dir = str(tmp_path / "plain")
    ref = [r["loss"] for r in read_rows(train(plain) / "metrics.jsonl")]

    spec = make_spec(max_steps=6, lr=2e-2)
    spec.data.val, spec.train.eval_every = val_json, 2
    run = train(spec)
    rows = read_rows(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    # validation runs in eval mode and draws no random numbers: the same training losses
    assert [r["loss"] for r in rows] == pytest.approx(ref, rel=1e-6)
    val = {r["step"]: r["val_loss"] for r in rows if r["val_loss"] is not None}
    assert sorted(val) == [2, 4, 6]
    assert val[6] < val[2]  # the val samples are training samples: their loss falls too
    assert all(r["grad_norm"] > 0 and r["lr"] > 0 for r in rows)
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["val_loss"] == val[6] and summary["loss"] == rows[-1]["loss"]
    assert summary["samples_per_s"] > 0 and summary["val_seconds"] > 0


def test_log_every_keeps_step_one_and_the_last(make_spec):
    rows = read_rows(train(make_spec(max_steps=6, log_every=5)) / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 5, 6]


def test_plot_has_loss_lr_and_grad_norm_panels(make_spec, val_json):
    spec = make_spec(max_steps=3)
    spec.data.val, spec.train.eval_every = val_json, 1
    with Image.open(train(spec) / "loss_curve.png") as im:
        assert im.size == (700, 650)  # 7 x 6.5 inches at 100 dpi: the three-panel figure


def test_smooth_is_debiased():
    assert smooth([2.0, 2.0, 2.0]) == pytest.approx([2.0, 2.0, 2.0])
    out = smooth([4.0, 0.0], weight=0.5)
    assert out == pytest.approx([4.0, (0.5 * 2.0) / 0.75])


def test_tensorboard_event_files_hold_the_scalars(make_spec, val_json):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (requirements-lock.txt)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    spec = make_spec(max_steps=4, report_to="tensorboard")
    spec.data.val, spec.train.eval_every = val_json, 2
    run = train(spec)
    logs = sorted((run / "logs" / "graft").glob("events.out.tfevents.*"))
    assert logs, list((run / "logs").rglob("*"))
    acc = EventAccumulator(str(logs[0].parent)).Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/grad_norm", "train/samples_per_s", "val/loss"} <= tags
    rows = read_rows(run / "metrics.jsonl")
    loss = acc.Scalars("train/loss")
    assert [e.step for e in loss] == [1, 2, 3, 4]
    assert [e.value for e in loss] == pytest.approx([r["loss"] for r in rows], rel=1e-5)
    assert [e.step for e in acc.Scalars("val/loss")] == [2, 4]
    # one run: the spec's hparams live in the same event files, not in a timestamp-named run
    assert [p.name for p in (run / "logs" / "graft").iterdir() if p.is_dir()] == []
    assert [p.name for p in (run / "logs").iterdir()] == ["graft"]
    assert {"_hparams_/experiment", "_hparams_/session_start_info"} <= set(acc.summary_metadata)


def test_new_fields_are_strict(make_spec):
    with pytest.raises(GraftConfigError, match="train.report_to='tensorbord': use one of none, "
                       "tensorboard, trackio, wandb, mlflow"):
        make_spec(report_to="tensorbord")
    with pytest.raises(GraftConfigError, match=r"train.eval_every=5 needs data.val"):
        make_spec(eval_every=5)
    with pytest.raises(GraftConfigError, match=r"train.eval_every=-1: must be >= 0"):
        make_spec(eval_every=-1)


def test_a_tracker_that_is_not_installed_is_one_error_before_training(make_spec, tmp_path):
    from accelerate.utils import is_wandb_available

    if is_wandb_available():
        pytest.skip("wandb is installed here; the missing-package message cannot be shown")
    with pytest.raises(GraftConfigError, match="train.report_to=wandb: the wandb package is not "
                       "installed; pip install wandb, or set train.report_to=none"):
        train(make_spec(report_to="wandb"))
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_mlflow_run_holds_the_scalars(make_spec, monkeypatch):
    pytest.importorskip("mlflow", reason="mlflow is not installed (pip install mlflow-skinny)")
    import mlflow
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run = train(make_spec(max_steps=3, report_to="mlflow"))
    store = f"sqlite:///{(run / 'logs' / 'mlflow.db').resolve()}"
    client = MlflowClient(tracking_uri=store)
    [found] = client.search_runs([client.get_experiment_by_name("graft").experiment_id])
    assert found.info.run_name == run.name and found.data.params["train.max_steps"] == "3"
    history = client.get_metric_history(found.info.run_id, "train/loss")
    rows = read_rows(run / "metrics.jsonl")
    assert [m.step for m in history] == [1, 2, 3]
    assert [m.value for m in history] == pytest.approx([r["loss"] for r in rows], rel=1e-6)
    mlflow.set_tracking_uri("")
