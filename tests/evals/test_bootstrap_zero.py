"""--bootstrap 0 means "no confidence interval" (ci: null) in eval, compare and the library
calls quantize uses; a negative count is one line before anything runs."""

import json

import pytest

from graft.errors import GraftConfigError
from graft.evals import compare_runs
from graft.evals.dataset import Sample
from graft.evals.runner import score_task
from graft.evals.task import get_task


def test_score_task_without_bootstrap():
    spec = get_task("example_pope")
    samples = [Sample(str(i), "q", target=t) for i, t in enumerate(["yes", "no", "yes"])]
    preds = ["yes", "yes", None]
    with_ci, _ = score_task(spec, samples, preds, n_boot=20, seed=0)
    none, rows = score_task(spec, samples, preds, n_boot=0, seed=0)
    assert none["score"] == with_ci["score"] and none["ci"] is None
    assert {k: v["value"] for k, v in none["scores"].items()} == {k: v["value"] for k, v in with_ci["scores"].items()}
    assert all(v["ci"] is None for v in none["scores"].values())
    with pytest.raises(GraftConfigError, match=r"--bootstrap .* >= 0, got -5"):
        score_task(spec, samples, preds, n_boot=-5, seed=0)


def test_cli_eval_and_compare_without_bootstrap(failed_run, dead_url, tmp_path, capsys):
    from graft.cli import main

    out = tmp_path / "zero"
    args = ["eval", "--endpoint", dead_url, "--endpoint-model", "m", "--retries", "0", "--tasks",
            "example_pope", "--limit", "2", "--no-cache", "--out", str(out)]
    assert main(args + ["--bootstrap", "-5"]) == 2
    assert "--bootstrap (n_boot) must be a whole number >= 0, got -5" in capsys.readouterr().err
    assert not out.exists()
    assert main(args + ["--bootstrap", "0"]) == 0
    table = capsys.readouterr().out
    assert "example_pope  f1      0.0000  -" in table
    assert json.loads((out / "results.json").read_text())["tasks"]["example_pope"]["ci"] is None

    failed_run(tmp_path / "other", limit=2)
    report = compare_runs(out, tmp_path / "other", n_boot=0)
    assert report["tasks"]["example_pope"]["ci"] is None and report["tasks"]["example_pope"]["delta"] == 0.0
    assert main(["eval", "compare", str(out), str(tmp_path / "other"), "--bootstrap", "0"]) == 0
    assert "+0.0000  -" in capsys.readouterr().out
    with pytest.raises(GraftConfigError, match="got -1"):
        compare_runs(out, tmp_path / "other", n_boot=-1)
