"""Bad inputs and outputs of `graft eval` and `graft eval compare`: one line naming the file and
the fix, checked before any work, and nothing a user made is replaced without --overwrite."""

import json
from pathlib import Path

import pytest

from graft.errors import GraftConfigError, GraftDataError
from graft.evals import compare_runs, run_eval
from graft.evals.report import check_out_dir


def _one_line_error(main, args, capsys) -> str:
    assert main(args) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1, err
    assert captured.out == ""  # refused before any task ran or any table printed
    return err


def test_eval_out_checked_before_any_task(dead_url, tmp_path, capsys):
    from graft.cli import main

    blocker = tmp_path / "file.json"
    blocker.write_text('{"precious": 1}')
    args = ["eval", "--endpoint", dead_url, "--endpoint-model", "m", "--retries", "0", "--tasks",
            "example_pope", "--limit", "1", "--no-cache", "--bootstrap", "5", "--out"]
    assert f"--out: output {blocker} is a file, not a folder; give a folder path" in \
        _one_line_error(main, args + [str(blocker)], capsys)
    assert f"{blocker} is a file, not a folder; give a path under a folder" in \
        _one_line_error(main, args + [str(blocker / "sub")], capsys)
    assert blocker.read_text() == '{"precious": 1}'
    with pytest.raises(GraftConfigError, match="is a file, not a folder"):  # the python API too
        run_eval(dead_url, tasks=["nope_not_a_task"], out_dir=blocker)
    check_out_dir(tmp_path / "new" / "deeper")  # fine, and creates nothing
    assert not (tmp_path / "new").exists()


def _unwritable_folder(tmp_path):
    """A folder this process cannot write: a read-only one, or (as root, whom permissions do
    not stop) /sys; None where neither holds."""
    import tempfile

    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    for place in (locked, Path("/sys")):
        try:
            with tempfile.TemporaryFile(dir=place):
                pass
        except OSError:
            return place
    return None


def test_unwritable_out_folder(dead_url, tmp_path, capsys):
    from graft.cli import main

    place = _unwritable_folder(tmp_path)
    if place is None:
        pytest.skip("no folder here refuses writes")
    out = place / "eval"
    err = _one_line_error(main, ["eval", "--endpoint", dead_url, "--endpoint-model", "m", "--retries", "0",
                                 "--tasks", "example_pope", "--limit", "1", "--out", str(out)], capsys)
    assert f"--out: output {out} is not writable" in err
    (tmp_path / "locked").chmod(0o700)


@pytest.fixture
def two_runs(failed_run, tmp_path):
    failed_run(tmp_path / "a", limit=2)
    failed_run(tmp_path / "b", limit=2)
    return tmp_path / "a", tmp_path / "b"


def test_compare_bad_runs_are_one_line(two_runs, tmp_path, capsys):
    from graft.cli import main

    a, b = two_runs
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    assert f"{listed} is not a `graft eval` results.json" in _one_line_error(
        main, ["eval", "compare", str(a), str(listed)], capsys)
    results = (b / "results.json").read_text()
    (b / "results.json").write_text(results[:100])
    assert f"{b / 'results.json'}: not valid JSON" in _one_line_error(main, ["eval", "compare", str(a), str(b)], capsys)
    (b / "results.json").write_text(results)
    samples = b / "samples_example_pope.jsonl"
    samples.write_text(samples.read_text()[:-40])  # a truncated last line
    with pytest.raises(GraftDataError, match=r"samples_example_pope\.jsonl:2: not valid JSON"):
        compare_runs(a, b)


def test_compare_out_refuses_files_and_overwrites(two_runs, tmp_path, capsys):
    from graft.cli import main

    a, b = two_runs
    blocker = tmp_path / "file.json"
    blocker.write_text("mine")
    assert f"--out: output {blocker} is a file, not a folder" in _one_line_error(
        main, ["eval", "compare", str(a), str(b), "--out", str(blocker)], capsys)
    out = tmp_path / "cmp"
    out.mkdir()
    (out / "compare.json").write_text('{"precious": 1}')
    args = ["eval", "compare", str(a), str(b), "--bootstrap", "5", "--out", str(out)]
    assert f"--out {out} already holds compare.json; --overwrite replaces it" in _one_line_error(main, args, capsys)
    assert json.loads((out / "compare.json").read_text()) == {"precious": 1}
    assert main(args + ["--overwrite"]) == 0
    assert json.loads((out / "compare.json").read_text())["tasks"]["example_pope"]["n"] == 2
