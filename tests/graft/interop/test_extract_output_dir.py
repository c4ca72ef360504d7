"""graft extract / graft export OUT: a user's dir is never written into, a wrong or unwritable
path is refused before the donor or run is read, and OUT appears whole or not at all."""

import json

import pytest

from graft.errors import GraftConfigError
from graft.interop.extract import extract
from graft.io import OutputPathError
from tests.graft.cli_asserts import fails


def _names(d):
    return sorted(p.name for p in d.iterdir())


def test_extract_refuses_a_users_dir_before_reading_the_donor(k25_dir, tmp_path, capsys,
                                                              monkeypatch):
    import graft.interop.extract as mod

    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my notes")
    (out / "projector").mkdir()
    monkeypatch.setattr(mod, "CheckpointReader", lambda root: pytest.fail("donor was read"))
    with pytest.raises(GraftConfigError, match=r"mine exists and was not written by graft "
                                               r"\(no extract.json\); choose an empty or new"):
        extract(k25_dir, out, "both")
    fails(capsys, ["extract", str(k25_dir), str(out)], "graft extract: error:", "no extract.json")
    assert _names(out) == ["notes.txt", "projector"] and _names(out / "projector") == []
    assert (out / "notes.txt").read_text() == "my notes"
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(OutputPathError, match="afile is a file, not a folder"):
        extract(k25_dir, afile, "both")
    assert _names(tmp_path) == ["afile", "mine"]


def test_extract_replaces_its_own_output_whole_and_leaves_nothing_when_it_fails(
        k25_dir, tmp_path, monkeypatch):
    import graft.adapters

    out = tmp_path / "parts"
    extract(k25_dir, out, "both")
    assert _names(out) == ["extract.json", "projector", "vision"]
    extract(k25_dir, out, "projector")  # an earlier extract is graft's: replaced, not merged
    assert _names(out) == ["extract.json", "projector"]
    assert json.loads((out / "extract.json").read_text())["part"] == "projector"
    assert _names(tmp_path) == ["parts"]  # no temp dir left beside it

    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # Ctrl-C while the projector is written

    fresh = tmp_path / "fresh"
    monkeypatch.setattr(graft.adapters, "save_adapter", crash)
    with pytest.raises(KeyboardInterrupt):
        extract(k25_dir, fresh, "both")
    assert _names(tmp_path) == ["parts"]  # nothing half-written, so a rerun is not refused
    monkeypatch.undo()
    summary = extract(k25_dir, fresh, "both")
    assert summary["encoder"]["path"] == str(fresh / "vision")  # the final path, not the temp
    assert summary["adapter"]["path"] == str(fresh / "projector")


def test_export_refuses_a_file_or_users_dir_before_loading(tmp_path, tiny_llama, tiny_clip_dir,
                                                           capsys):
    from tests.run_dirs import write_run_dir

    run = write_run_dir(tmp_path / "run", tiny_llama, {"kind": "clip", "path": str(tiny_clip_dir)},
                        {"kind": "mlp", "depth": 2})
    afile = tmp_path / "train.json"
    afile.write_text("{}")
    for fmt in ("hf-llava", "vllm"):
        fails(capsys, ["export", str(run), str(afile), "--format", fmt],
              f"output {afile} is a file, not a folder")
        fails(capsys, ["export", str(run), str(afile / "sub"), "--format", fmt],
              f"{afile} is a file, not a folder; give a path under a folder")
        fails(capsys, ["export", str(run), str(run), "--format", fmt],
              "was not written by graft (no graft_export.json)")
    assert afile.read_text() == "{}"
