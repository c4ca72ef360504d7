"""`graft tune` and `graft tune synth` check --out before any work: an existing file needs
--force (it is a user's file until then), a folder or an unwritable place is one line."""

import pytest

from graft.tune.state import state_path
from tests.graft.cli_asserts import fails


def tune_argv(tmp_path, out, *extra):
    # no trace, no model: the check must come before either is read
    return ["tune", str(tmp_path / "missing.jsonl"), "--model", str(tmp_path / "nomodel"),
            "--slo", "ttft_p99_ms=500", "--out", str(out), *extra]


def test_tune_refuses_an_existing_out_without_force(tmp_path, capsys):
    out = tmp_path / "mine.yaml"
    out.write_text("my own notes\n")
    fails(capsys, tune_argv(tmp_path, out), f"--out {out} exists; pass --force to overwrite it")
    assert out.read_text() == "my own notes\n" and not state_path(out).exists()
    # with --force the check passes and the run goes on to the model (missing here)
    fails(capsys, tune_argv(tmp_path, out, "--force"), "nomodel: neither a run dir")


@pytest.mark.parametrize("command", ["tune", "synth"])
def test_out_a_folder_or_under_a_file_is_refused_first(tmp_path, capsys, command):
    def argv(out):
        if command == "synth":
            return ["tune", "synth", "--profile", "chat", "--out", str(out), "--force"]
        return tune_argv(tmp_path, out, "--force")

    example = "trace.jsonl" if command == "synth" else "tuned.yaml"
    fails(capsys, argv(tmp_path), f"--out {tmp_path} is a folder; name a file, e.g. "
          f"--out {tmp_path / example}")
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    fails(capsys, argv(blocker / "out.yaml"),
          f"--out: output {blocker / 'out.yaml'}: {blocker} is a file, not a folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_an_image_trace_on_a_text_only_model_is_refused_before_it_loads(tiny_llama, tmp_path,
                                                                       capsys):
    from graft.cli import main

    trace = tmp_path / "burst.jsonl"
    assert main(["tune", "synth", "--profile", "image-burst", "--n", "4",
                 "--out", str(trace)]) == 0
    fails(capsys, ["tune", str(trace), "--model", str(tiny_llama), "--slo", "ttft_p99_ms=500",
                   "--out", str(tmp_path / "tuned.yaml")],
          f"TRACE {trace}: request 0 has images but --model {tiny_llama} is an LLM dir")
