"""`graft chat`: ranges on sampling flags, plain LLM dirs, --system, the REPL; one-line errors."""

import io
import re
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


def test_a_failed_image_turn_is_forgotten_with_its_image(tmp_path):
    """A model that refuses images: the turn fails once, and the next one works (the image is
    not carried into every later turn until /reset)."""
    from graft.errors import GraftConfigError

    img = tmp_path / "q.png"
    Image.new("RGB", (32, 32)).save(img)
    seen = []

    def answer(messages, images, on_text=None):
        seen.append(len(images))
        if images:
            raise GraftConfigError("x is a plain LLM dir (no vision encoder)")
        return "ok"

    out = io.StringIO()
    assert repl(answer, Conversation(), [], io.StringIO(f"/image {img}\nwhat?\nand now?\n"), out) == 0
    assert seen == [1, 0]
    text = out.getvalue()
    assert "error: x is a plain LLM dir (no vision encoder) (this turn and its 1 image(s) " \
           "is forgotten)" in text
    assert "> ok\n" in text  # the next turn, without the image, answered


def test_multi_line_messages_clear_and_set(tmp_path):
    import argparse

    seen = []

    def answer(messages, images, on_text=None):
        seen.append(messages[-1]["content"])
        return "ok"

    lines = ['"""first line', "", "third line", 'last"""', 'one \\', "two", '"""same line"""',
             "/set", "/set temperature 0.7", "/set top_p 0", "/set max_tokens 9", "/set seed none",
             "/set temperature", "/set bogus 1", "/set system Be brief.", "/clear", "after clear"]
    options = argparse.Namespace(temperature=0.0, top_p=1.0, max_new_tokens=64, seed=3,
                                 verbose=False)
    out = io.StringIO()
    assert repl(answer, Conversation(), [], io.StringIO("\n".join(lines)), out, options) == 0
    assert seen == ["first line\n\nthird line\nlast", "one \ntwo", "same line", "after clear"]
    assert (options.temperature, options.top_p, options.max_new_tokens, options.seed) == \
        (0.7, 1.0, 9, None)
    text = out.getvalue()
    assert text.count("... ") == 4  # the continuation prompt, once per extra line
    assert "(temperature 0.0, top_p 1.0, max_new_tokens 64, seed 3; quiet)" in text
    assert "(temperature 0.7)" in text and "(max_new_tokens 9)" in text and "(seed None)" in text
    assert "error: /set top_p: 0 is out of range: use 0.0 < value <= 1.0" in text
    assert "error: /set temperature needs a value, e.g. /set temperature 0.0" in text
    assert "error: /set bogus: unknown; use one of temperature, top_p, max_new_tokens, seed" in text
    assert "(system: Be brief.)" in text and "(new chat)" in text


def test_verbose_prints_tokens_and_tokens_per_second():
    from graft.chat_backends import Answerer

    def answer(messages, images, on_text=None):
        on_text("four tokens of text")
        return "four tokens of text", 4

    out = io.StringIO()
    answerer = Answerer(answer, False, "banner")
    assert repl(answerer, Conversation(), [], io.StringIO("/set verbose\nhi\n/set quiet\nagain\n"),
                out) == 0
    lines = out.getvalue().splitlines()
    timing = [line for line in lines if line.startswith("(4 tokens, ")]
    assert len(timing) == 1, lines  # after the first answer only
    assert re.fullmatch(r"\(4 tokens, [\d.]+ s, [\d.]+ tokens/s, first text after \d+ ms\)",
                        timing[0])


def test_repl_in_a_terminal(tiny_llama, tmp_path):
    """`graft chat` on a pty, as a person types: the banner, /image refused on a text-only
    model (and the next turn fine), a \"\"\" message over lines, a line continued with \\,
    /set, timings with /set verbose, /clear, Ctrl-D."""
    import os
    import pty
    import select
    import subprocess
    import time

    master, slave = pty.openpty()
    env = {**os.environ, "HOME": str(tmp_path), "TERM": "dumb"}  # history under tmp_path
    proc = subprocess.Popen([sys.executable, "-m", "graft.cli", "chat", str(tiny_llama),
                             "--max-new-tokens", "3"], stdin=slave, stdout=slave, stderr=slave,
                            env=env, close_fds=True)
    os.close(slave)
    seen = b""

    def expect(text: str, timeout: float = 300.0) -> str:
        nonlocal seen
        deadline = time.monotonic() + timeout
        while text.encode() not in seen:
            ready, _, _ = select.select([master], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, f"no {text!r} in {seen.decode(errors='replace')!r}"
            try:
                seen += os.read(master, 4096)
            except OSError:  # the child closed the terminal
                break
        assert text.encode() in seen, seen.decode(errors="replace")
        before, _, seen = seen.partition(text.encode())
        return before.decode(errors="replace")

    def send(line: str) -> None:
        os.write(master, line.encode() + b"\r")

    try:
        expect(f"graft chat: {tiny_llama} (text only; HF generate, cpu)")
        expect("commands: /image PATH")
        send(f"/image {tmp_path / 'cat.png'}")
        expect("error: this model takes text only")
        send("/set verbose")
        expect("(verbose: timings after each answer)")
        send('"""first line')
        expect("... ")
        send('second line"""')
        assert re.search(r"\(\d+ tokens, [\d.]+ s, ", expect(" tokens/s"))
        send("one \\")
        expect("... ")
        send("two")
        expect(" tokens/s")
        send("/set temperature 0.5")
        expect("(temperature 0.5)")
        send("/set top_p 2")
        expect("error: /set top_p: 2 is out of range")
        send("hello")
        expect(" tokens/s")
        send("/clear")
        expect("(new chat)")
        # Ctrl-D once readline reads the terminal (its prompt is out): a ^D typed while the
        # terminal is still in line mode is consumed there, as an end of input nobody read
        expect("> ")
        os.write(master, b"\x04")
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)


def test_engine_errors_name_the_command_once(tiny_llama, capsys):
    # the engine refuses a prompt past --max-model-len: its reason, after one "graft chat:"
    err = _fails(capsys, ["chat", str(tiny_llama), "hello there, how are you doing today?",
                          "--quantization", "int8", "--max-model-len", "4"],
                 "graft chat: error: request", "is 4; shorten the prompt")
    assert err.count("graft chat:") == 1 and len(err.strip().splitlines()) == 1
