"""What a run reports while it trains: a metrics.jsonl row from step 1 on, the same values to
the accelerate tracker `train.report_to` names, and the plot drawn from the rows at the end."""

from __future__ import annotations

import json
from pathlib import Path

from graft.errors import GraftConfigError
from graft.run_dir import RunDir

REPORT_TO = ("none", "tensorboard", "trackio", "wandb", "mlflow")
PROJECT = "graft"  # the tracker project; TensorBoard writes under <run dir>/logs/graft
SMOOTHING = 0.9  # EMA weight of the plot's smoothed loss (debiased, as TensorBoard does)

# metrics.jsonl key -> tracker tag (TensorBoard groups tags by the part before "/")
TAGS = {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm",
        "samples_per_s": "train/samples_per_s", "val_loss": "val/loss"}


def check_report_to(name: str) -> None:
    """GraftConfigError when the tracker's package is missing: accelerate itself would only
    drop it with a debug message and train without it."""
    if name == "none":
        return
    from accelerate.utils import (is_mlflow_available, is_tensorboard_available,
                                  is_trackio_available, is_wandb_available)

    available = {"tensorboard": is_tensorboard_available, "trackio": is_trackio_available,
                 "wandb": is_wandb_available, "mlflow": is_mlflow_available}[name]
    if not available():
        raise GraftConfigError(f"train.report_to={name}: the {name} package is not installed; "
                               f"pip install {name}, or set train.report_to=none")


def accelerator_kwargs(report_to: str, run_dir: Path) -> dict:
    """Accelerator(...) arguments for the tracker (none: no tracker)."""
    if report_to == "none":
        return {}
    from accelerate.utils import ProjectConfiguration

    return {"log_with": report_to, "project_config": ProjectConfiguration(
        project_dir=str(run_dir), logging_dir=str(RunDir(run_dir).tracker_dir))}


def flat_config(tree: dict, prefix: str = "") -> dict:
    """The spec as one level of scalars (TensorBoard's hparams take no lists or mappings)."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flat_config(value, f"{prefix}{key}."))
        elif value is None or isinstance(value, (bool, int, float, str)):
            out[f"{prefix}{key}"] = value
        else:
            out[f"{prefix}{key}"] = str(value)
    return out


class Reporter:
    """Writes rows (main process only) to metrics.jsonl and the tracker."""

    def __init__(self, accel, spec, run_dir: Path):
        self.accel, self.run = accel, RunDir(run_dir)
        self.tracking = spec.train.report_to != "none"
        if not self.tracking:
            return
        config = flat_config(spec.to_dict())
        if spec.train.report_to == "mlflow":
            mlflow_store(self.run.tracker_dir)
        tensorboard = spec.train.report_to == "tensorboard"
        name = self.run.path.name
        accel.init_trackers(PROJECT, config=None if tensorboard else config,
                            init_kwargs={"wandb": {"name": name}, "trackio": {"name": name},
                                         "mlflow": {"run_name": name}})
        if tensorboard and accel.is_main_process:
            tensorboard_hparams(accel.get_tracker("tensorboard", unwrap=True), config)

    def log(self, row: dict) -> None:
        with open(self.run.metrics_file, "a") as fh:
            fh.write(json.dumps(row) + "\n")
        if self.tracking:
            self.accel.log({TAGS[k]: v for k, v in row.items() if k in TAGS and v is not None},
                           step=row["step"])

    def close(self) -> None:
        if self.tracking:
            self.accel.end_training()


def mlflow_store(tracker_dir: Path) -> None:
    """MLflow's runs in <run dir>/logs/mlflow.db (beside TensorBoard's logs), unless
    $MLFLOW_TRACKING_URI names a server or store; MLflow's own default is ./mlflow.db."""
    import os

    import mlflow

    if not os.environ.get("MLFLOW_TRACKING_URI"):
        Path(tracker_dir).mkdir(parents=True, exist_ok=True)
        mlflow.set_tracking_uri(f"sqlite:///{Path(tracker_dir).resolve() / 'mlflow.db'}")


def tensorboard_hparams(writer, config: dict) -> None:
    """The spec as hparams in the run's own event file: accelerate's `store_init_configuration`
    (torch's add_hparams) writes them to a second run named by a timestamp instead."""
    from torch.utils.tensorboard.summary import hparams

    file_writer = writer._get_file_writer()
    for summary in hparams(config, {}):
        file_writer.add_summary(summary)
    writer.flush()


def read_rows(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln] if path.is_file() else []


def trim_rows(path: Path, step: int) -> None:
    """On resume, drop rows past the checkpoint so the log matches one clean run."""
    if path.is_file():
        path.write_text("".join(json.dumps(r) + "\n" for r in read_rows(path) if r["step"] <= step))


def smooth(values: list[float], weight: float = SMOOTHING) -> list[float]:
    """Debiased exponential moving average: the first points are not pulled towards 0."""
    out, avg = [], 0.0
    for i, v in enumerate(values, 1):
        avg = weight * avg + (1 - weight) * v
        out.append(avg / (1 - weight ** i))
    return out


def plot_run(run_dir: Path) -> None:
    """loss_curve.png: train loss (raw and smoothed) with the validation points, the learning
    rate and the gradient norm, against the optimizer step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from graft.io import atomic_write

    run = RunDir(run_dir)
    rows = read_rows(run.metrics_file)
    fig, (ax_loss, ax_lr, ax_grad) = plt.subplots(
        3, 1, figsize=(7, 6.5), sharex=True, gridspec_kw={"height_ratios": [2.2, 1, 1]})
    train_rows = [r for r in rows if r.get("loss") is not None]
    steps = [r["step"] for r in train_rows]
    losses = [r["loss"] for r in train_rows]
    ax_loss.plot(steps, losses, color="tab:blue", alpha=0.3, lw=1, label="train (raw)")
    ax_loss.plot(steps, smooth(losses), color="tab:blue", lw=2,
                 label=f"train (EMA {SMOOTHING:g})")
    val = [(r["step"], r["val_loss"]) for r in rows if r.get("val_loss") is not None]
    if val:
        ax_loss.plot(*zip(*val), "o-", color="tab:orange", lw=1.5, label="validation")
    ax_loss.set_ylabel("loss")
    ax_loss.legend(loc="upper right", fontsize=8)
    ax_loss.set_title(run.path.name)
    ax_lr.plot(steps, [r.get("lr") for r in train_rows], color="tab:green")
    ax_lr.set_ylabel("learning rate")
    grads = [(r["step"], r["grad_norm"]) for r in train_rows if r.get("grad_norm") is not None]
    if grads:
        ax_grad.plot(*zip(*grads), color="tab:red", lw=1)
    ax_grad.set_ylabel("grad norm\n(before clipping)")
    ax_grad.set_xlabel("optimizer step")
    for ax in (ax_loss, ax_lr, ax_grad):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    atomic_write(run.loss_curve, fig.savefig, suffix=".png")
    plt.close(fig)
