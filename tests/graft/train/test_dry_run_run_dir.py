"""`graft train --dry-run` writes nothing, so an output_dir holding a run does not stop it: it
says what the real run would do there (which still refuses without --resume/--overwrite)."""

from graft.cli import main
from tests.graft.cli_asserts import fails
from tests.graft.test_train_cli_guards import _config


def test_dry_run_reports_the_run_dir_instead_of_refusing(make_spec, tmp_path, capsys):
    spec = make_spec(max_steps=1)
    cfg = _config(tmp_path, spec)
    run = tmp_path / "run"
    assert main(["train", cfg, "--dry-run"]) == 0
    assert f"output_dir {run}: a new run would be written there" in capsys.readouterr().out
    assert main(["train", cfg]) == 0
    before = {p.name: p.stat().st_mtime_ns for p in run.iterdir()}
    capsys.readouterr()

    assert main(["train", cfg, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "data.train: 12 samples" in out
    assert f"output_dir {run} already holds a run: the real run needs --resume (continue it) " \
           "or --overwrite (replace it)" in out
    assert main(["train", cfg, "--dry-run", "--overwrite"]) == 0
    assert f"output_dir {run} holds a run: --overwrite would replace it" in capsys.readouterr().out
    assert main(["train", cfg, "--dry-run", "--resume"]) == 0
    assert f"--resume would continue from {run / 'checkpoints' / 'step_00000001'}" in \
        capsys.readouterr().out
    assert {p.name: p.stat().st_mtime_ns for p in run.iterdir()} == before  # nothing touched
    fails(capsys, ["train", cfg], f"output_dir {run} already holds a run")  # the real run: no
