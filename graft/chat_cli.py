"""`graft chat PATH [--image IMG] ["question"]`: one answer, or a multi-turn REPL when no
question is given; PATH is a run dir (images + text) or a plain LLM dir (text only). HF
generate by default, graft's engine when an engine option is given (e.g. `--quantization`: the
LLM's weights in low precision)."""

from __future__ import annotations

import sys

from graft.cli_types import number_in
from graft.serving.engine.config import DTYPES
from graft.serving.engine.engine_args import add_engine_args

EXAMPLES = """examples:
  graft chat runs/quickstart --image cat.png "What is in the picture?"
  graft chat runs/quickstart                  # REPL: /image PATH, /reset, /quit
  graft chat ~/models/smollm2 --system "Answer briefly." "Name a prime."
  graft chat runs/quickstart --quantization int4 --image cat.png "Which colour?"
"""

REPL_HELP = "commands: /image PATH (attach to the next message), /reset (new chat), /quit"


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
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
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

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []
        self.images = []

    def ask(self, text: str, images) -> tuple[list[dict], list]:
        """The chat with this user turn added (kept only once `answered`)."""
        from graft.template import IMAGE_MARKER

        if images and IMAGE_MARKER not in text:
            text = IMAGE_MARKER * len(images) + "\n" + text
        return self.messages + [{"role": "user", "content": text}], self.images + list(images)

    def answered(self, messages: list[dict], images: list, text: str) -> None:
        self.messages = messages + [{"role": "assistant", "content": text}]
        self.images = images


def repl(answer, chat: Conversation, pending: list, stdin=None, out=None) -> int:
    """Read lines until EOF or /quit; a failed turn prints its error and is forgotten."""
    from graft.errors import GraftError
    from graft.train.data import load_image

    stdin, out = stdin or sys.stdin, out or sys.stdout
    say = lambda text: print(text, file=out, flush=True)  # noqa: E731
    say(REPL_HELP)
    for line in stdin:
        line = line.strip()
        try:
            if not line:
                continue
            if line in ("/quit", "/exit"):
                break
            if line == "/reset":
                chat.reset()
                pending = []
                say("(new chat)")
            elif line.startswith("/image"):
                pending.append(load_image(line[len("/image"):].strip()))
                say(f"(images for the next message: {len(pending)})")
            elif line.startswith("/"):
                raise GraftError(f"unknown command {line.split()[0]}; {REPL_HELP}")
            else:
                messages, images = chat.ask(line, pending)
                text = answer(messages, images)
                chat.answered(messages, images, text)
                pending = []
                say(text)
        except GraftError as err:
            say(f"error: {err}")
    return 0
