"""`graft bench peers MODEL_DIR`: graft against llama.cpp and vLLM-CPU on the same HF checkpoint.

Every run measures each tool in turn (the order rotates run by run, so no tool always goes
first on a drifting machine): batch-1 decode, decode of --batch sequences and prefill of
--prompt-len tokens in each matched weight format, then the serve-under-load row (`graft
bench serve`'s client against `graft serve` and against vLLM's OpenAI server, one seeded
workload). It prints and writes min / median / max of each figure and of the ratio graft /
peer over the runs (the ratio of run i pairs graft's and the peer's run i), with the CPU
model, the flags that matter, the thread count and the memory read bandwidth measured at the
start of every run. A peer that cannot be found, built or started is skipped with one line
saying why; the table still prints for the others.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from graft.benchmarks import peers_llamacpp, peers_report, peers_serve, peers_vllm
from graft.benchmarks.peers_llamacpp import PeerUnavailable
from graft.benchmarks.formats import DEFAULT
from graft.benchmarks.peers_report import FORMATS, ON_FILE
from graft.cli_types import number_in
from graft.io import atomic_write_json, atomic_write_text
from graft.subprocess_argv import graft_argv

PEERS = ("llama.cpp", "vllm")
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16")
_count = number_in(int, low=1)


def add_arguments(p) -> None:
    p.add_argument("model_dir", type=Path, help="HF LLM directory (config.json + safetensors)")
    p.add_argument("--peers", default="llama.cpp,vllm", help="of: " + ", ".join(PEERS))
    p.add_argument("--formats", default="f32,bf16,q8_0,q4_0,q4_1", help="of: " + ", ".join(FORMATS))
    p.add_argument("--graft-int4", choices=peers_report.INT4_CHOICES, default="exact",
                   help="graft's scheme beside q4_0/q4_1: exact = int4-g32 (fp32 activations), "
                        "a8 = int4-g32-a8 (activations rounded to int8 per 32, as llama.cpp's Q4)")
    p.add_argument("--graft-on-file", default=None, metavar="FORMATS",
                   help="of the quantized --formats (" + ", ".join(peers_llamacpp.QUANTIZED) + "): "
                        "graft's row runs on llama.cpp's own file of that format, as `graft serve "
                        "FILE.gguf` holds it (the same weights), not on the checkpoint in its scheme")
    p.add_argument("--runs", type=_count, default=3)
    p.add_argument("--threads", type=_count, default=usable_cpus(),
                   help="threads of every tool (default: %(default)s, the CPUs this process may use)")
    p.add_argument("--llama-cpp", type=Path, default=None, metavar="DIR",
                   help="a built llama.cpp tree (bin/ or build/bin/ with llama-bench, "
                        "llama-batched-bench, llama-quantize; convert_hf_to_gguf.py + gguf-py)")
    p.add_argument("--llama-cpp-cache", type=Path,
                   default=Path("~/.cache/graft/llama.cpp").expanduser(),
                   help="where llama.cpp is built from the llama-cpp-python sdist without --llama-cpp")
    p.add_argument("--no-build", action="store_true",
                   help="never build llama.cpp: skip it when none is found")
    p.add_argument("--vllm-venv", type=Path, default=None,
                   help="vLLM's venv (default: $GRAFT_VLLM_VENV, else the checkout's .venv-vllm)")
    p.add_argument("--prompt-len", type=_count, default=512, help="prompt tokens of the prefill row")
    p.add_argument("--context", type=_count, default=32, help="prompt tokens before batch-1 decode")
    p.add_argument("--decode-tokens", type=_count, default=64,
                   help="batch-1: tokens decoded; batch decode: half as many; serve: max_tokens")
    p.add_argument("--batch", type=_count, default=32,
                   help="sequences (64-token prompts) of the batch decode row")
    p.add_argument("--serve-format", default="bf16", help="weight format of the serve row")
    p.add_argument("--serve-requests", type=number_in(int, low=0), default=64,
                   help="requests of the serve row (0: no serve row)")
    p.add_argument("--serve-concurrency", type=_count, default=16)
    p.add_argument("--bandwidth-mb", type=_count, default=1024,
                   help="buffer read to measure memory bandwidth at the start of each run")
    peers_report.add_output_arguments(p, "peers.json", "bandwidths, the table")


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _choices(text: str, allowed, flag: str) -> list[str]:
    from graft.errors import GraftConfigError

    items = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in items if s not in allowed]
    if bad or not items:
        raise GraftConfigError(f"{flag} {text!r}: use a comma list of {', '.join(allowed)}")
    return list(dict.fromkeys(items))


def machine_info(threads: int) -> dict:
    model, flags = "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:  # not Linux: the model and flags stay unknown
        pass
    return {"cpu_model": model, "cpu_flags": {f: f in flags for f in CPU_FLAGS},
            "threads": threads, "cpus": os.cpu_count()}


def sizes(args, model_dir: Path) -> dict:
    """The sizes every tool runs, clamped to the model's context (as graft's engine does)."""
    config = json.loads((model_dir / "config.json").read_text())
    max_len = config.get("max_position_embeddings") or 4096
    prompt_len = min(args.prompt_len, max_len - 1)
    need = max(args.context + args.decode_tokens, 64 + args.decode_tokens // 2, prompt_len + 1)
    if need > max_len:
        from graft.errors import GraftConfigError

        raise GraftConfigError(f"--context {args.context} + --decode-tokens {args.decode_tokens} "
                               f"exceed the model's {max_len} positions: use smaller values")
    return {"context": args.context, "decode_tokens": args.decode_tokens, "batch": args.batch,
            "batch_prompt": 64, "prompt_len": prompt_len, "seed": args.seed,
            "vocab": prompt_vocab(model_dir, config["vocab_size"]),
            "max_model_len": min(need + 8, max_len),
            # a served chat prompt: template + --prompt-words words, well under 512 tokens
            "serve_max_model_len": min(512 + args.decode_tokens, max_len)}


def prompt_vocab(model_dir: Path, vocab_size: int) -> int:
    """Token ids below this make the random prompts: the model's vocab, or the tokenizer's
    where it is smaller (a `graft models random` checkpoint has a few hundred tokens and a
    real model's vocab rows), since vLLM refuses ids its tokenizer does not know."""
    from transformers import AutoTokenizer

    try:
        return min(vocab_size, len(AutoTokenizer.from_pretrained(model_dir)))
    except (OSError, ValueError):  # no tokenizer there: every tool then draws from the model's
        return vocab_size


def graft_offline(args, schemes: list[tuple[str, str]], size: dict,
                  files: dict[str, Path] | None = None) -> dict[str, dict[str, float]]:
    """scheme -> tok/s, from `graft bench engine --quantization` in a fresh process per
    engine dtype (schemes: (scheme, dtype) pairs); a "FORMAT-file" scheme runs on llama.cpp's
    file of FORMAT (`files`) in the engine's own choice for it, in a process of its own."""
    found = {}
    runs = [(args.model_dir, dtype, [s for s, d in schemes if d == dtype and not s.endswith(ON_FILE)])
            for dtype in dict.fromkeys(d for _, d in schemes)]
    runs += [(files[s.removesuffix(ON_FILE)], d, [s]) for s, d in schemes
             if s.endswith(ON_FILE) and s.removesuffix(ON_FILE) in (files or {})]
    for model, dtype, names in (r for r in runs if r[2]):
        on_file = names[0].endswith(ON_FILE)
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "r.json"
            cmd = [*graft_argv("bench", "engine", str(model)),
                   "--quantization", DEFAULT if on_file else ",".join(names),
                   "--dtype", dtype, "--decode-tokens", str(size["decode_tokens"]),
                   "--context", str(size["context"]), "--batch", str(size["batch"]),
                   "--prefill-len", str(size["prompt_len"]), "--bandwidth-mb", str(args.bandwidth_mb),
                   "--threads", str(args.threads), "--out", str(out)]
            res = subprocess.run(cmd, capture_output=True, text=True,
                                 env=dict(os.environ, OMP_NUM_THREADS=str(args.threads)))
            if res.returncode:
                raise RuntimeError(f"graft bench engine exited {res.returncode}:\n{res.stderr[-2000:]}")
            formats = json.loads(out.read_text())["formats"]
            found.update({names[0]: formats[DEFAULT]} if on_file else formats)
    return {name: {"batch1_decode": f["batch1_decode_tokens_per_s"],
                   "batch_decode": f["batch32_decode_tokens_per_s"],
                   "prefill": f["prefill512_tokens_per_s"]} for name, f in found.items()}


def setup_peers(args, formats: list[str], out_dir: Path) -> tuple[dict, dict[str, str]]:
    """name -> the peer object, and name -> why it is skipped."""
    ready, skipped = {}, {}
    for name in _choices(args.peers, PEERS, "--peers"):
        try:
            if name == "llama.cpp":
                tool = peers_llamacpp.find(args.llama_cpp, args.llama_cpp_cache,
                                           build=not args.no_build, jobs=args.threads)
                cache = peers_llamacpp.gguf_cache(out_dir, args.model_dir)
                ready[name] = (tool, {})
                for fmt in formats:  # a format that fails to convert leaves the others
                    try:
                        ready[name][1][fmt] = tool.gguf(args.model_dir, fmt, cache)
                    except PeerUnavailable as err:
                        _skip(skipped, f"{name} {fmt}", err)
            else:
                ready[name] = (peers_vllm.find(args.vllm_venv), None)
        except PeerUnavailable as err:
            _skip(skipped, name, err)
    return ready, skipped


def _on_file(args, formats: list[str], serve_fmt: str) -> tuple[str, ...]:
    """--graft-on-file's formats, checked: quantized ones of --formats, not the serve row's
    (that row serves the checkpoint), llama.cpp among the peers."""
    from graft.errors import GraftConfigError

    if args.graft_on_file is None:
        return ()
    chosen = _choices(args.graft_on_file, peers_llamacpp.QUANTIZED, "--graft-on-file")
    outside = [f for f in chosen if f not in formats]
    if outside:
        raise GraftConfigError(f"--graft-on-file {','.join(outside)}: not in --formats {args.formats}; "
                               "add them there")
    if args.serve_requests and serve_fmt in chosen:
        raise GraftConfigError(f"--graft-on-file {serve_fmt}: the serve row serves the checkpoint; "
                               "pass another --serve-format, or --serve-requests 0")
    if "llama.cpp" not in _choices(args.peers, PEERS, "--peers"):
        raise GraftConfigError("--graft-on-file needs llama.cpp in --peers: it makes the files")
    return tuple(chosen)


def _skip(skipped: dict, what: str, err: Exception) -> None:
    skipped[what] = str(err)
    print(f"skipping {what}: {err}", flush=True)


def run(args) -> int:
    import torch

    formats = _choices(args.formats, FORMATS, "--formats")
    serve_fmt = _choices(args.serve_format, FORMATS, "--serve-format")[0]
    on_file = _on_file(args, formats, serve_fmt)
    if not args.model_dir.joinpath("config.json").is_file():
        from graft.errors import GraftConfigError

        raise GraftConfigError(f"model_dir {args.model_dir}: no config.json (pass an HF LLM dir)")
    size = sizes(args, args.model_dir)
    torch.set_num_threads(args.threads)  # the bandwidth read, as the tools' threads
    machine = machine_info(args.threads)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    peers, skipped = setup_peers(args, formats, args.out)
    if "vllm" in peers:
        unmatched = [f for f in formats if f not in peers_vllm.DTYPES]
        if unmatched:
            print(f"vllm: no row for {', '.join(unmatched)} (vLLM-CPU runs those only from "
                  "checkpoints quantized beforehand, not the same weights)", flush=True)
    matched = peers_report.graft_formats(args.graft_int4, on_file)
    schemes = list(dict.fromkeys((matched[f]["graft"], matched[f]["graft_dtype"]) for f in formats))
    # a kill (SIGTERM) unwinds like Ctrl-C: the servers and tool processes are stopped
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        result = _runs(args, peers, formats, schemes, size, serve_fmt, machine, skipped, matched)
    finally:
        signal.signal(signal.SIGTERM, previous)
    peers_report.print_table(result)
    return 0


def _runs(args, peers, formats, schemes, size, serve_fmt, machine, skipped, matched) -> dict:
    """Every run in turn; the JSON (and Markdown) rewritten after each, so a long benchmark
    stopped early keeps the runs it finished. Returns the last result."""
    from graft.benchmarks.formats import read_bandwidth

    values: dict[str, list[float]] = {}
    bandwidth = []
    logs = args.out.parent / f"{args.out.stem}-logs"
    logs.mkdir(exist_ok=True)
    for i in range(args.runs):
        bandwidth.append(read_bandwidth(args.bandwidth_mb << 20))
        tools = ["graft", *peers]
        for tool in peers_serve.in_turn(tools, i):
            print(f"run {i + 1}/{args.runs}: {tool}", flush=True)
            _measure(tool, peers, args, formats, schemes, size, values, skipped)
        if args.serve_requests:
            _serve_row(i, peers, args, serve_fmt, matched[serve_fmt]["graft"], size, values,
                       skipped, logs)
        result = {"model_dir": str(args.model_dir), "machine": machine,
                  "read_bandwidth_bytes_per_s": bandwidth, "sizes": size, "runs": i + 1,
                  "peers": {name: tool.describe() for name, (tool, _) in peers.items()},
                  "skipped": skipped, "serve_format": serve_fmt,
                  "formats": {f: matched[f] for f in formats},
                  "values": values, "summary": peers_report.summary(values),
                  "rows": peers_report.rows(values, peers, formats, serve_fmt, i + 1,
                                            {f: m["graft"] for f, m in matched.items()}),
                  **peers_report.provenance(args)}
        atomic_write_json(args.out, result)
        if args.markdown:
            atomic_write_text(args.markdown, peers_report.markdown(result))
    return result


def _measure(tool, peers, args, formats, schemes, size, values, skipped) -> None:
    if tool == "graft":
        files = peers["llama.cpp"][1] if "llama.cpp" in peers else {}
        for scheme, row in graft_offline(args, schemes, size, files).items():
            _add(values, "graft", scheme, row)
        return
    peer, ggufs = peers[tool]
    for fmt in formats:
        if f"{tool} {fmt}" in skipped or (tool == "vllm" and fmt not in peers_vllm.DTYPES):
            continue
        try:
            if tool == "llama.cpp":
                row = peer.bench(ggufs[fmt], args.threads, size["prompt_len"],
                                 size["decode_tokens"], size["batch"], size["batch_prompt"])
            else:
                row = peer.offline(args.model_dir, fmt, args.threads, size)
        except PeerUnavailable as err:  # that format leaves the table, the others stay
            _skip(skipped, f"{tool} {fmt}", err)
            continue
        _add(values, tool, fmt, row)


def _serve_row(i, peers, args, fmt, scheme, size, values, skipped, logs) -> None:
    vllm = peers["vllm"][0] if "vllm" in peers and fmt in peers_vllm.DTYPES \
        and "vllm serve" not in skipped else None
    servers = peers_serve.serve_servers(args.model_dir, fmt, size["serve_max_model_len"], args.threads, vllm,
                                        scheme)
    if "llama.cpp" in peers:
        skipped.setdefault("llama.cpp serve", "llama-server is not built (the build makes "
                                               "llama-bench, llama-batched-bench, llama-quantize)")
    rows, failed = peers_serve.measure_each(
        servers, i, args.runs, logs, "serve", lambda url: peers_serve.load(
            url, args.serve_requests, args.serve_concurrency, size["decode_tokens"], args.seed))
    for name, err in failed.items():
        _skip(skipped, f"{name} serve", err)
    for name, row in rows.items():
        _add(values, name, scheme if name == "graft" else fmt, row)


def _add(values: dict, tool: str, fmt: str, row: dict) -> None:
    for metric, value in row.items():
        values.setdefault(f"{tool} {fmt} {metric}", []).append(value)
