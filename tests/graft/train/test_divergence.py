"""A run whose loss or gradients turn non-finite stops at that step with one line naming it
and the fix; nothing of that step is applied or saved, the last good checkpoint stays intact
and no final adapter is written (a NaN adapter would look like a finished run).

The NaN comes in through the real data path: the feature cache's files on disk are replaced
by NaN features mid-run, as a damaged or foreign cache entry would be read."""

import pytest
import torch
from safetensors.torch import load_file, save_file

from graft.cli import main
from graft.errors import GraftError
from graft.train.loop import train
from tests.graft.test_train_cli_guards import _config


def poison(cache_root):
    entries = list(cache_root.glob("*/*/*.safetensors"))
    assert entries
    for path in entries:
        feats = load_file(str(path))["features"]
        save_file({"features": torch.full_like(feats, float("nan"))}, str(path))


def test_a_nan_loss_stops_at_its_step_and_keeps_the_last_good_checkpoint(make_spec, tmp_path):
    cache = tmp_path / "features"
    spec = make_spec(max_steps=5, save_every=1, feature_cache=str(cache))

    def at_step(step, loss):
        if step == 3:  # epoch 1 (3 steps) cached every image; epoch 2 reads NaN features
            poison(cache)

    with pytest.raises(GraftError, match=r"training diverged at step 4: the loss is nan") as err:
        train(spec, on_step=at_step)
    message = str(err.value)
    run = tmp_path / "run"
    assert "\n" not in message and "lower train.lr (now 0.005" in message
    assert f"the newest good checkpoint {run / 'checkpoints' / 'step_00000003'} is kept" in message
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_00000002",
                                                                       "step_00000003"]
    kept = load_file(str(run / "checkpoints" / "step_00000003" / "adapter.safetensors"))
    assert all(torch.isfinite(t).all() for t in kept.values())
    assert not (run / "adapter.safetensors").exists() and not (run / "train_summary.json").exists()


def test_divergence_through_the_cli_is_one_line_and_exit_2(make_spec, tmp_path, capsys):
    cache = tmp_path / "features"
    warm = make_spec(max_steps=3, feature_cache=str(cache))
    warm.output_dir = str(tmp_path / "warm")
    train(warm)  # every training image is in the cache now
    poison(cache)
    cfg = _config(tmp_path, make_spec(max_steps=3, feature_cache=str(cache)))
    capsys.readouterr()
    assert main(["train", cfg]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    err = [line for line in err.splitlines() if "graft train: error:" in line]
    assert len(err) == 1
    err = err[0]
    assert "training diverged at step 1: the loss is nan" in err
    assert "no checkpoint was saved" in err and "--overwrite" in err
    assert not (tmp_path / "run" / "adapter.safetensors").exists()
