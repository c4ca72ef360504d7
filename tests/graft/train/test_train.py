"""Training: loss goes down, the LLM stays bit-identical, resume and feature cache are exact."""

import json
from pathlib import Path

import pytest

from graft.io import weights_sha256
from graft.train.loop import train


def losses(run_dir):
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows]


def test_align_lowers_loss_and_keeps_llm(make_spec, tiny_llama):
    before = weights_sha256(tiny_llama)
    spec = make_spec(max_steps=8, lr=2e-2)
    run = train(spec)
    ls = losses(run)
    assert len(ls) == 8
    assert ls[-1] < 0.9 * ls[0] and max(ls[-3:]) < min(ls[:2])
    assert weights_sha256(tiny_llama) == before
    for name in ("graft.yaml", "adapter.safetensors", "adapter.json", "metrics.jsonl",
                 "loss_curve.png", "train_summary.json"):
        assert (run / name).is_file(), name
    saved = (run / "graft.yaml").read_text()
    assert before in saved  # the LLM digest is recorded in the run dir


class Interrupt(Exception):
    pass


def test_resume_reproduces_uninterrupted_losses(make_spec, tmp_path):
    clean = make_spec(max_steps=6, save_every=2)
    clean.output_dir = str(tmp_path / "clean")
    ref = losses(train(clean))

    broken = make_spec(max_steps=6, save_every=2)
    broken.output_dir = str(tmp_path / "broken")

    def crash(step, loss):
        if step == 3:
            raise Interrupt

    with pytest.raises(Interrupt):
        train(broken, on_step=crash)
    resumed = losses(train(broken, resume=True))
    assert resumed == pytest.approx(ref, abs=0, rel=1e-6)
    # train.keep_checkpoints (2): the older periodic checkpoints are gone
    kept = sorted(p.name for p in (tmp_path / "broken" / "checkpoints").iterdir())
    assert kept == ["step_00000004", "step_00000006"]


def test_feature_cache_hit_equals_miss(make_spec, tmp_path):
    cache = str(tmp_path / "features")
    a = make_spec(max_steps=3, feature_cache=cache)
    a.output_dir = str(tmp_path / "a")
    la = losses(train(a))
    b = make_spec(max_steps=3, feature_cache=cache)
    b.output_dir = str(tmp_path / "b")
    run_b = train(b)
    summary = json.loads((run_b / "train_summary.json").read_text())
    assert summary["feature_cache"]["misses"] == 0 and summary["feature_cache"]["hits"] > 0
    c = make_spec(max_steps=3)
    c.output_dir = str(tmp_path / "c")
    assert losses(run_b) == la
    assert losses(train(c)) == pytest.approx(la, rel=1e-6)


def test_standardize_measures_training_features_before_step_one(make_spec, tmp_path, capsys):
    import torch

    from graft.adapters import load_adapter
    from graft.train.data import load_image
    from graft.model import GraftedModel

    spec = make_spec(max_steps=2, feature_cache=str(tmp_path / "features"))
    spec.adapter["standardize"] = True
    run = train(spec)
    # the pass before step 1 says what it waits for (a cold cache: every image is encoded)
    assert "encoding 12 training images (adapter.standardize stats)" in capsys.readouterr().err
    # the saved stats are the mean/std over every token of every training image
    images = sorted((Path(spec.data.image_root) / "images").glob("*.png"))
    feats = torch.cat(GraftedModel.from_spec(spec).encode_images([load_image(p) for p in images]))
    adapter = load_adapter(run)
    torch.testing.assert_close(adapter.feature_mean, feats.mean(0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(adapter.feature_std, feats.std(0), rtol=1e-4, atol=1e-5)
    # measured through the feature cache: training itself then misses nothing
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["feature_cache"]["misses"] == 12  # the 12 training images, once


def test_finetune_stage_trains_lora_only(make_spec, tiny_llama):
    before = weights_sha256(tiny_llama)
    run = train(make_spec(stage="finetune", max_steps=2))
    assert (run / "lora").is_dir()
    assert weights_sha256(tiny_llama) == before
