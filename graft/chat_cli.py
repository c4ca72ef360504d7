"""`graft chat PATH [--image IMG] ["question"]`: one answer, or a multi-turn REPL when no
question is given; PATH is a run dir (images + text) or a plain LLM dir (text only). HF
generate by default, graft's engine when an engine option is given (e.g. `--quantization`: the
LLM's weights in low precision)."""

from __future__ import annotations

import sys

from graft.cli_types import number_in, torch_device
from graft.serving.engine.config import DTYPES
from graft.serving.engine.engine_args import add_engine_args

EXAMPLES = """examples:
  graft chat runs/quickstart --image cat.png "What is in the picture?"
  graft chat runs/quickstart                  # REPL: /image PATH, /set, /clear, /quit, ...
  graft chat ~/models/smollm2 --system "Answer briefly." "Name a prime."
  graft chat runs/quickstart --quantization int4 --image cat.png "Which colour?"
"""

REPL_HELP = ("commands: /image PATH (attach to the next message), /system [TEXT] (set or clear "
             "the system message), /set [NAME VALUE] (temperature, top_p, max_new_tokens, seed; "
             "/set verbose or quiet: timings after each answer), /clear or /reset (new chat), "
             "/help, /quit. A message over several lines: wrap it in \"\"\" or end each line "
             "but the last with \\. Ctrl-C stops an answer, Ctrl-D quits")
PROMPT = "> "
MORE = "... "  # the prompt for the next line of a message
QUOTES = '"""'
HISTORY = "~/.cache/graft/chat_history"  # readline history across sessions

def add_arguments(parser) -> None:
    parser.add_argument("run_dir", metavar="PATH",
                        help="run dir (graft.yaml + adapter.safetensors) or plain HF LLM dir")
    parser.add_argument("question", nargs="?", default=None,
                        help="the user message; one <image> marker is added per --image unless "
                        "the text already has them. Without it: a multi-turn REPL")
    parser.add_argument("--image", action="append", default=[], help="image file (repeatable)")
    parser.add_argument("--system", default=None, help="system message for the chat")
    parser.add_argument("--max-new-tokens", type=number_in(int, low=1), default=64,
                        help="most tokens per answer (>= 1)")
    parser.add_argument("--temperature", type=number_in(float, low=0.0, high=2.0), default=0.0,
                        help="0 = greedy; sampling up to 2")
    parser.add_argument("--top-p", type=number_in(float, low=0.0, high=1.0, low_open=True),
                        default=1.0, help="with --temperature > 0: sample from the smallest set "
                        "of tokens whose probability reaches P (0 < P <= 1; 1: every token)")
    parser.add_argument("--seed", type=int, default=None, help="sampling seed")
    parser.add_argument("--device", default="cpu", type=torch_device,
                        help="cpu, cuda, cuda:1, ...")
    parser.add_argument("--dtype", default=None, choices=DTYPES,
                        help="LLM weights dtype (default: llm.dtype of the run, else float32)")
    # any engine option given (--quantization, --kv-cache-dtype, ...): answer on graft's engine
    add_engine_args(parser, exclude=("device", "dtype", "seed"), unset=True)
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show transformers' weight-loading bars, and in the REPL the tokens, "
                        "time and tokens/s of each answer (as /set verbose)")


def run(args) -> int:
    from graft.chat_backends import open_backend
    from graft.train.data import load_image

    images = [load_image(p) for p in args.image]  # a wrong path fails before any weights load
    answer = open_backend(args.run_dir, args)
    chat = Conversation(args.system)
    if args.question is not None:
        print(answer(*chat.ask(args.question, images)))
        return 0
    print(answer.banner)
    return repl(answer, chat, images, options=args)


class Conversation:
    """Messages and images so far; every user turn carries one <image> marker per image."""

    def __init__(self, system: str | None = None):
        self.system = system
        self.reset()

    def set_system(self, text: str | None) -> None:
        """A new system message for this chat and the next ones; the turns so far stay."""
        self.system = text or None
        turns = [m for m in self.messages if m["role"] != "system"]
        self.messages = ([{"role": "system", "content": self.system}] if self.system else []) + turns

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []
        self.images = []

    def ask(self, text: str, images) -> tuple[list[dict], list]:
        """The chat with this user turn added (kept only once `answered`)."""
        from graft.image_prompt import with_image_markers

        text = with_image_markers(text, len(images))
        return self.messages + [{"role": "user", "content": text}], self.images + list(images)

    def answered(self, messages: list[dict], images: list, text: str) -> None:
        self.messages = messages + [{"role": "assistant", "content": text}]
        self.images = images


# what /set changes: the same ranges as the flags
SETTABLE = {"temperature": number_in(float, low=0.0, high=2.0),
            "top_p": number_in(float, low=0.0, high=1.0, low_open=True),
            "max_new_tokens": number_in(int, low=1),
            "seed": lambda text: None if text in ("none", "random") else number_in(int)(text)}
SET_ALIASES = {"max_tokens": "max_new_tokens", "num_predict": "max_new_tokens"}  # OpenAI, ollama
DEFAULTS = {"temperature": 0.0, "top_p": 1.0, "max_new_tokens": 64, "seed": None, "verbose": False}


def repl(answer, chat: Conversation, pending: list, stdin=None, out=None, options=None) -> int:
    """Read messages until EOF or /quit, streaming each answer as it is generated; a failed or
    interrupted turn prints why and is forgotten, with its images. On a terminal: readline
    editing and history. `options`: the sampling flags /set changes (argparse's namespace)."""
    import argparse

    stdin, out = stdin or sys.stdin, out or sys.stdout
    options = options if options is not None else argparse.Namespace(**DEFAULTS)
    say = lambda text: print(text, file=out, flush=True)  # noqa: E731
    read = _terminal_reader() if stdin is sys.stdin and stdin.isatty() else _line_reader(stdin, out)
    say(REPL_HELP)
    while True:
        try:
            line = read_message(read)
        except KeyboardInterrupt:  # at the prompt: a fresh line, as a shell does
            say("")
            continue
        except EOFError:  # Ctrl-D
            say("")
            return 0
        if line is None:  # the end of piped input: leave the shell's prompt on a line of its own
            say("")
            return 0
        if line.strip() in ("/quit", "/exit"):
            return 0
        pending = _turn(line.strip(), answer, chat, pending, say, out, options)


def read_message(read) -> str | None:
    """One message: a line; the lines up to a closing \"\"\" when it opens with one (as
    ollama); lines joined while each ends with a backslash (as llama-cli). None: end of input."""
    line = read(PROMPT)
    if line is None:
        return None
    if line.lstrip().startswith(QUOTES):
        lines, text = [], line.lstrip()[len(QUOTES):]
        while not text.rstrip().endswith(QUOTES):
            lines.append(text)
            text = read(MORE)
            if text is None:  # input ended inside the quotes: what came is the message
                return "\n".join(lines)
        return "\n".join(lines + [text.rstrip()[:-len(QUOTES)]])
    lines = []
    while line.endswith("\\"):
        lines.append(line[:-1])
        line = read(MORE)
        if line is None:
            line = ""
    return "\n".join(lines + [line])


def _turn(line: str, answer, chat: Conversation, pending: list, say, out, options) -> list:
    """One REPL message or command; returns the images still waiting for the next message."""
    from graft.errors import GraftError
    from graft.train.data import load_image

    command, _, rest = line.partition(" ")
    try:
        if not line:
            return pending
        if command in ("/reset", "/clear"):
            chat.reset()
            say("(new chat)")
            return []
        if command == "/image":
            if not getattr(answer, "takes_images", True):
                raise GraftError("this model takes text only (a plain LLM dir, no vision encoder); "
                                 "for images chat with a run dir written by `graft train`")
            pending = pending + [load_image(rest.strip())]
            say(f"(images for the next message: {len(pending)})")
            return pending
        if command == "/system" or (command == "/set" and rest.startswith("system")):
            text = rest.removeprefix("system") if command == "/set" else rest  # ollama's spelling
            chat.set_system(text.strip())
            say(f"(system: {chat.system})" if chat.system else "(no system message)")
            return pending
        if command == "/set":
            say(_set(options, rest.strip()))
            return pending
        if command == "/help":
            say(REPL_HELP)
            return pending
        if line.startswith("/"):
            raise GraftError(f"unknown command {command}; {REPL_HELP}")
    except GraftError as err:
        say(f"error: {err}")
        return pending
    return _ask(line, answer, chat, pending, say, out, options)


def _ask(line: str, answer, chat: Conversation, pending: list, say, out, options) -> list:
    """One message answered and kept; a failed or stopped one is forgotten with its images
    (kept, every later turn would fail the same way)."""
    import time

    from graft.errors import GraftError

    messages, images = chat.ask(line, pending)
    pieces, start, first = [], time.monotonic(), []

    def show(piece: str) -> None:
        if not pieces:
            first.append(time.monotonic())
        out.write(piece.lstrip() if not pieces else piece)
        out.flush()
        pieces.append(piece)

    try:
        text = answer(messages, images, on_text=show)
    except (KeyboardInterrupt, GraftError) as err:  # Ctrl-C stops this answer, not the REPL
        dropped = f" and its {len(images)} image(s)" if images else ""
        say(f"\n(stopped; this turn{dropped} is forgotten)" if isinstance(err, KeyboardInterrupt)
            else f"error: {err} (this turn{dropped} is forgotten)")
        return []
    say("" if pieces else text)
    chat.answered(messages, images, text)
    if options.verbose:
        say(_timings(getattr(answer, "tokens", None), start, first[0] if first else None,
                     time.monotonic()))
    return []


def _timings(tokens: int | None, start: float, first: float | None, end: float) -> str:
    """ollama's --verbose in one line: tokens, time, tokens/s, time to the first text."""
    parts = [f"{tokens} tokens" if tokens is not None else None, f"{end - start:.2f} s",
             f"{tokens / (end - start):.1f} tokens/s" if tokens and end > start else None,
             f"first text after {(first - start) * 1000:.0f} ms" if first is not None else None]
    return "(" + ", ".join(p for p in parts if p) + ")"


def _set(options, rest: str) -> str:
    """/set NAME VALUE (or alone: what is set now); a bad value: GraftError naming the range."""
    import argparse

    from graft.errors import GraftError

    name, _, value = rest.partition(" ")
    if not name:
        now = ", ".join(f"{k} {getattr(options, k)}" for k in SETTABLE)
        return f"({now}; {'verbose' if options.verbose else 'quiet'})"
    if name in ("verbose", "quiet"):
        options.verbose = name == "verbose"
        return f"({name}: {'timings after each answer' if options.verbose else 'no timings'})"
    name = SET_ALIASES.get(name, name)
    if name not in SETTABLE:
        raise GraftError(f"/set {name}: unknown; use one of {', '.join(SETTABLE)}, system, "
                         "verbose or quiet")
    if not value.strip():
        example = 1 if name == "seed" else DEFAULTS[name]
        raise GraftError(f"/set {name} needs a value, e.g. /set {name} {example}")
    try:
        setattr(options, name, SETTABLE[name](value.strip()))
    except argparse.ArgumentTypeError as err:
        raise GraftError(f"/set {name}: {err}") from None
    return f"({name} {getattr(options, name)})"


def _line_reader(stdin, out):
    """Lines from a pipe or file: the prompt is shown, None at the end."""
    def read(prompt: str) -> str | None:
        out.write(prompt)
        out.flush()
        line = stdin.readline()
        return None if not line else line.rstrip("\n")

    return read


def _terminal_reader(history: str = HISTORY):
    """input() with readline's line editing and a history kept in `history`."""
    load_history(history)
    return input


def load_history(path: str) -> bool:
    """Readline history from `path`, written back at exit; False where readline is missing."""
    import atexit
    import os

    try:
        import readline
    except ImportError:  # e.g. Windows without pyreadline: plain input()
        return False
    path = os.path.expanduser(path)
    try:
        readline.read_history_file(path)
    except OSError:
        pass  # the first session: no file yet
    readline.set_history_length(1000)

    def save() -> None:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            readline.write_history_file(path)
        except OSError:
            pass  # a read-only home: history is a convenience, not worth an error
    atexit.register(save)
    return True
