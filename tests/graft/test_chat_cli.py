"""`graft chat`: ranges on sampling flags, plain LLM dirs, --system, the REPL; one-line errors."""

import io
import sys

import pytest

from PIL import Image

from graft.chat_cli import Conversation, repl
from graft.cli import main
from tests.graft.cli_asserts import fails as _fails




def test_sampling_flags_have_ranges(tiny_run_dir, capsys):
    _fails(capsys, ["chat", str(tiny_run_dir), "hi", "--max-new-tokens", "0"],
           "argument --max-new-tokens: 0 is out of range: use >= 1")
    _fails(capsys, ["chat", str(tiny_run_dir), "hi", "--temperature", "-1"],
           "argument --temperature: -1 is out of range: use 0.0 <= value <= 2.0")
    _fails(capsys, ["chat", str(tiny_run_dir), "hi", "--temperature", "hot"],
           "argument --temperature: 'hot' is not a number")


def test_neither_run_nor_llm_dir(tmp_path, capsys):
    _fails(capsys, ["chat", str(tmp_path), "hi"], "neither a run dir (graft.yaml) nor an HF "
           "LLM dir (config.json)")


def test_plain_llm_dir_answers_text_and_refuses_images(tiny_llama, tmp_path, capsys):
    assert main(["chat", str(tiny_llama), "hi", "--system", "Be brief.",
                 "--max-new-tokens", "2"]) == 0
    assert main(["chat", str(tiny_llama), "hi", "--max-new-tokens", "2",
                 "--quantization", "int8"]) == 0  # the engine, text only
    assert main(["chat", str(tiny_llama), "hi", "--max-new-tokens", "2",
                 "--kv-cache-dtype", "int8"]) == 0  # the engine with an int8 KV cache
    capsys.readouterr()
    img = tmp_path / "q.png"
    Image.new("RGB", (32, 32)).save(img)
    for extra in ([], ["--quantization", "fp32"]):
        _fails(capsys, ["chat", str(tiny_llama), "--image", str(img), "hi", *extra],
               "is a plain LLM dir (no vision encoder)")


def test_missing_image_fails_before_loading(tiny_run_dir, tmp_path, capsys):
    _fails(capsys, ["chat", str(tiny_run_dir), "--image", str(tmp_path / "no.png"), "hi"],
           "no.png does not exist")


def test_repl_turns_images_reset(tmp_path):
    img = tmp_path / "q.png"
    Image.new("RGB", (32, 32), (255, 0, 0)).save(img)
    seen = []

    def answer(messages, images, on_text=None):
        seen.append(([dict(m) for m in messages], len(images)))
        on_text("answer ")
        on_text(f"{len(seen)}")
        return f"answer {len(seen)}"

    lines = [f"/image {img}", "what colour?", "and now?", "/image nope.png", "/bogus", "/reset",
             "fresh", "/quit", "never read"]
    out = io.StringIO()
    assert repl(answer, Conversation("Be brief."), [], io.StringIO("\n".join(lines)), out) == 0
    assert [n for _, n in seen] == [1, 1, 0]
    first, second, third = (m for m, _ in seen)
    assert first == [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": "<image>\nwhat colour?"}]
    assert second[2:] == [{"role": "assistant", "content": "answer 1"},
                          {"role": "user", "content": "and now?"}]
    assert third == [first[0], {"role": "user", "content": "fresh"}]  # /reset: a new chat
    text = out.getvalue()
    assert "nope.png does not exist" in text and "unknown command /bogus" in text
    assert "never read" not in text
    # a prompt before every line read, and each answer streamed onto its own line
    assert text.count("> ") == 8 and "> answer 1\n" in text


def test_repl_system_help_and_a_stopped_answer(tmp_path):
    seen = []

    def answer(messages, images, on_text=None):
        seen.append([dict(m) for m in messages])
        if len(seen) == 2:
            on_text("half an ans")
            raise KeyboardInterrupt  # Ctrl-C while it streams
        return "ok"  # a backend that does not stream: printed whole

    lines = ["hi", "/system Answer in French.", "again", "/help", "after", "/system", "last"]
    out = io.StringIO()
    assert repl(answer, Conversation(), [], io.StringIO("\n".join(lines)), out) == 0
    assert seen[0] == [{"role": "user", "content": "hi"}]
    # /system keeps the turns so far; the stopped turn is forgotten
    assert seen[1] == [{"role": "system", "content": "Answer in French."}, *seen[0],
                       {"role": "assistant", "content": "ok"}, {"role": "user", "content": "again"}]
    assert seen[2] == seen[1][:-1] + [{"role": "user", "content": "after"}]
    assert seen[3][0] == {"role": "user", "content": "hi"}  # /system alone: none again
    text = out.getvalue()
    assert "(system: Answer in French.)" in text and "(no system message)" in text
    assert "half an ans\n(stopped; this turn is forgotten)" in text
    assert text.count("/system [TEXT]") == 2  # the help at the start and on /help


def test_readline_history_is_read_back(tmp_path):
    readline = pytest.importorskip("readline")
    from graft.chat_cli import load_history

    path = tmp_path / "history"
    path.write_text("first question\n/image cat.png\n")
    readline.clear_history()
    assert load_history(str(path))
    n = readline.get_current_history_length()
    assert [readline.get_history_item(i) for i in (n - 1, n)] == ["first question", "/image cat.png"]


def test_repl_on_a_run_dir(tiny_run_dir, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\n"))
    assert main(["chat", str(tiny_run_dir), "--max-new-tokens", "2"]) == 0
    assert "/image PATH" in capsys.readouterr().out
    # graft's engine streams in the REPL too
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\n"))
    assert main(["chat", str(tiny_run_dir), "--max-new-tokens", "3", "--quantization", "int8"]) == 0
    out = capsys.readouterr().out
    assert out.count("> ") == 2 and "error" not in out


def test_loading_bars_quiet_unless_verbose(tiny_llama):
    import subprocess

    import os

    cmd = [sys.executable, "-m", "graft.cli", "chat", str(tiny_llama), "hi", "--max-new-tokens", "1"]
    # in-process main() calls in this session set the switch in os.environ: not inherited here
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    quiet = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert quiet.returncode == 0, quiet.stderr
    assert "Loading weights" not in quiet.stderr
    loud = subprocess.run(cmd + ["--verbose"], capture_output=True, text=True, timeout=300, env=env)
    assert "Loading weights" in loud.stderr


def test_usage_errors_are_one_line(capsys):
    assert main(["chat", "x", "--max-new-tokens", "0"]) == 2
    err = capsys.readouterr().err
    assert err == ("graft chat: error: argument --max-new-tokens: 0 is out of range: use >= 1 "
                   "(see graft chat --help)\n")


def test_ctrl_c_at_the_prompt_keeps_the_repl_and_ctrl_d_ends_it():
    class Keys:  # Ctrl-C at the first prompt, then a question, then Ctrl-D (end of input)
        def __init__(self):
            self.lines = iter([KeyboardInterrupt, "hi\n", ""])

        def readline(self):
            line = next(self.lines)
            if line is KeyboardInterrupt:
                raise KeyboardInterrupt
            return line

    asked = []
    out = io.StringIO()
    assert repl(lambda m, i, on_text=None: asked.append(m) or "ok", Conversation(), [], Keys(),
                out) == 0
    assert asked == [[{"role": "user", "content": "hi"}]]
    assert out.getvalue().count(">") == 3 and "ok\n" in out.getvalue()
