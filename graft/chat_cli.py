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
  graft chat runs/quickstart                  # REPL: /image PATH, /system TEXT, /reset, /quit
  graft chat ~/models/smollm2 --system "Answer briefly." "Name a prime."
  graft chat runs/quickstart --quantization int4 --image cat.png "Which colour?"
"""

REPL_HELP = ("commands: /image PATH (attach to the next message), /system [TEXT] (set or clear "
             "the system message), /reset (new chat), /help, /quit; Ctrl-C stops an answer, "
             "Ctrl-D quits")
PROMPT = "> "
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
                        help="show transformers' weight-loading bars")


def run(args) -> int:
    from graft.chat_backends import open_backend
    from graft.train.data import load_image

    images = [load_image(p) for p in args.image]  # a wrong path fails before any weights load
    answer = open_backend(args.run_dir, args)
    chat = Conversation(args.system)
    if args.question is not None:
        print(answer(*chat.ask(args.question, images)))
        return 0
    return repl(answer, chat, images)


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


def repl(answer, chat: Conversation, pending: list, stdin=None, out=None) -> int:
    """Read lines until EOF or /quit, streaming each answer as it is generated; a failed or
    interrupted turn prints why and is forgotten. On a terminal: readline editing and history."""
    stdin, out = stdin or sys.stdin, out or sys.stdout
    say = lambda text: print(text, file=out, flush=True)  # noqa: E731
    read = _terminal_reader() if stdin is sys.stdin and stdin.isatty() else _line_reader(stdin, out)
    say(REPL_HELP)
    while True:
        try:
            line = read(PROMPT)
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
        pending = _turn(line.strip(), answer, chat, pending, say, out)


def _turn(line: str, answer, chat: Conversation, pending: list, say, out) -> list:
    """One REPL line; returns the images still waiting for the next message."""
    from graft.errors import GraftError
    from graft.train.data import load_image

    command, _, rest = line.partition(" ")
    try:
        if not line:
            return pending
        if command == "/reset":
            chat.reset()
            say("(new chat)")
            return []
        if command == "/image":
            pending = pending + [load_image(rest.strip())]
            say(f"(images for the next message: {len(pending)})")
            return pending
        if command == "/system":
            chat.set_system(rest.strip())
            say(f"(system: {chat.system})" if chat.system else "(no system message)")
            return pending
        if command == "/help":
            say(REPL_HELP)
            return pending
        if line.startswith("/"):
            raise GraftError(f"unknown command {command}; {REPL_HELP}")
        messages, images = chat.ask(line, pending)
        pieces = []

        def show(piece: str) -> None:
            out.write(piece.lstrip() if not pieces else piece)
            out.flush()
            pieces.append(piece)

        text = answer(messages, images, on_text=show)
        say("" if pieces else text)
        chat.answered(messages, images, text)
        return []
    except KeyboardInterrupt:  # Ctrl-C stops this answer, not the REPL
        say("\n(stopped; this turn is forgotten)")
    except GraftError as err:
        say(f"error: {err}")
    return pending


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
