"""The demo's closing lines work when pasted into a fresh shell: `graft` is put on PATH first."""

import os

from graft.quickstart.recipe import activate_hint, next_steps


def test_activation_line_when_graft_is_not_on_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    python = str(tmp_path / ".venv" / "bin" / "python")
    assert activate_hint(python, lambda name: None) == \
        f"  source {os.path.join('.venv', 'bin')}/activate      # once per shell: puts `graft` on PATH\n"
    # another environment's graft on PATH is not this one
    assert "activate" in activate_hint(python, lambda name: "/usr/local/bin/graft")
    assert activate_hint(python, lambda name: str(tmp_path / ".venv" / "bin" / "graft")) == ""


def test_next_steps_start_with_the_hint_and_name_the_chat_page():
    text = next_steps("runs/q", "data/q/images/a.png", "What shape?", "data/q", "  HINT\n")
    lines = text.splitlines()
    assert lines[:2] == ["next:", "  HINT"]
    assert lines[2].startswith("  graft chat runs/q ")
    assert any("http://127.0.0.1:8000/" in ln for ln in lines)
