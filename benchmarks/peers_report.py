"""What `graft bench peers` reports: the matched formats, the rows of ratios, the printed table,
and a Markdown block for docs/benchmarks.md that carries its own provenance (command, date,
commit, CPU model and flags, threads, the bandwidth read in every run)."""

from __future__ import annotations

import shlex
import statistics
import subprocess
from datetime import datetime, timezone
from pathlib import Path

# peer format -> graft's scheme holding the same bits per weight
FORMATS = {"f32": "fp32", "bf16": "bf16", "q8_0": "int8", "q4_0": "int4-g32", "q4_1": "int4-g32",
           "q4_k_m": "int4-g32"}
# the graft engine dtype a format runs under: bf16 peers compute in bf16 (vLLM's bfloat16,
# llama.cpp's BF16 matmuls), so graft's bf16 row is its bf16 engine; the rest run fp32
GRAFT_DTYPE = {"bf16": "bfloat16"}
MATCH = {"f32": "same weights", "bf16": "same weights, bf16 activations (graft --dtype bfloat16)",
         "q8_0": "graft int8: one fp32 scale per output row; Q8_0: one fp16 scale per 32 weights",
         "q4_0": "graft int4-g32: scale + min per 32 weights; Q4_0: scale only (symmetric)",
         "q4_1": "graft int4-g32 and Q4_1: scale + min per 32 weights (the same layout)",
         "q4_k_m": "graft int4-g32: scale + min per 32 weights; Q4_K_M: Q4_K (6-bit scale and "
                   "min per 32, per 256) with Q6_K for the output and some attn_v / ffn_down"}
# --graft-on-file: graft's side of a quantized format is llama.cpp's own file, served as
# `graft serve FILE.gguf` holds it (each weight in its blocks' own scheme): the same weights
ON_FILE = "-file"  # graft's label of such a row: q8_0-file, ...
FILE_MATCH = ("graft on llama.cpp's own file, each weight held as its blocks are: Q4_0/Q4_1/Q4_K "
              "in int4-g32, Q8_0/Q6_K in int8-g32/g16 (the rest fp32)")
# --graft-int4 a8: llama.cpp's Q4 formats multiply by activations rounded to 8 bits (Q8 blocks
# of 32), which graft's -a8 schemes do too; plain int4-g32 keeps them in fp32
A8_FORMATS = {"q4_0": "int4-g32-a8", "q4_1": "int4-g32-a8"}
A8_MATCH = {"q4_0": "graft int4-g32-a8: scale + min per 32 weights; Q4_0: scale only; both "
                    "round activations to int8 per 32 (Q8_0)",
            "q4_1": "graft int4-g32-a8 and Q4_1: scale + min per 32 weights, activations "
                    "rounded to int8 per 32 (Q8_1): the same arithmetic"}
INT4_CHOICES = ("exact", "a8")
# metric -> (label, unit); tok/s: a ratio above 1 favours graft; ms: below 1 does
METRICS = {"batch1_decode": ("batch-1 decode", "tok/s"),
           "batch_decode": ("batch-{batch} decode", "tok/s"),
           "prefill": ("prefill-{prompt_len}", "tok/s"),
           "serve_output_tok_s": ("serve output", "tok/s"),
           "serve_ttft_p50_ms": ("serve TTFT p50", "ms"), "serve_ttft_p99_ms": ("serve TTFT p99", "ms")}
# the flags of `graft bench peers` a figure depends on, in the order a command line shows them
_FLAGS = ("peers", "formats", "runs", "threads", "llama_cpp", "vllm_venv", "prompt_len",
          "context", "decode_tokens", "batch", "serve_format", "serve_requests",
          "serve_concurrency", "bandwidth_mb", "graft_int4", "graft_on_file", "seed", "out")


def graft_formats(int4: str = "exact", on_file: tuple[str, ...] = ()) -> dict[str, dict[str, str]]:
    """peer format -> {"graft": scheme, "graft_dtype", "match"}: FORMATS, with int4="a8" the Q4
    formats matched by int4-g32-a8, and the formats of `on_file` by graft serving llama.cpp's
    own file of them ("q8_0-file": graft bench engine FILE --quantization default)."""
    a8 = int4 == "a8"
    found = {f: {"graft": A8_FORMATS[f] if a8 and f in A8_FORMATS else FORMATS[f],
                 "graft_dtype": GRAFT_DTYPE.get(f, "float32"),
                 "match": A8_MATCH[f] if a8 and f in A8_MATCH else MATCH[f]} for f in FORMATS}
    for f in on_file:
        found[f] = {"graft": f + ON_FILE, "graft_dtype": "float32", "match": FILE_MATCH}
    return found


def spread(v: list[float]) -> list[float]:
    return [min(v), statistics.median(v), max(v)]


def _order(key: str) -> tuple:
    """Offline rows before serve rows, by format, graft before its peers."""
    tool, fmt, metric = key.split(" ")
    names, fmt = list(FORMATS), fmt.removesuffix(ON_FILE)
    pos = names.index(fmt) if fmt in FORMATS else next(
        i for i, f in enumerate(names) if fmt in (FORMATS[f], A8_FORMATS.get(f)))
    return metric.startswith("serve"), pos, tool != "graft", tool, list(METRICS).index(metric)


def summary(values: dict[str, list[float]]) -> dict[str, list[float]]:
    """"tool format metric" -> min / median / max, in the table's order."""
    return {k: spread(values[k]) for k in sorted(values, key=_order)}


def rows(values, peers, formats, serve_fmt, runs: int, schemes: dict | None = None) -> list[dict]:
    """One row per (peer, format, metric) both tools measured in every run; the ratio of run i
    is graft's run i over the peer's run i. schemes: peer format -> graft's (default FORMATS)."""
    schemes = schemes or FORMATS
    out = []
    for peer in peers:
        for fmt in formats:
            for metric in METRICS:
                if metric.startswith("serve") and fmt != serve_fmt:
                    continue
                g = values.get(f"graft {schemes[fmt]} {metric}", [])
                p = values.get(f"{peer} {fmt} {metric}", [])
                if len(g) == len(p) == runs:
                    out.append({"peer": peer, "format": fmt, "graft_scheme": schemes[fmt],
                                "metric": metric, "unit": METRICS[metric][1], "graft": spread(g),
                                "peer_values": spread(p),
                                "ratio": spread([a / b for a, b in zip(g, p)])})
    return out


def provenance(args, command: str = "peers", flags: tuple[str, ...] = _FLAGS) -> dict:
    """The command line that reproduces the run (`graft bench COMMAND MODEL_DIR` and `flags`
    of `args`), its date (UTC) and the checkout's commit."""
    words = ["graft", "bench", command, str(args.model_dir)]
    for name in flags:
        value = getattr(args, name)
        if value is not None:
            words += [f"--{name.replace('_', '-')}", str(value)]
    if getattr(args, "no_build", False):
        words.append("--no-build")
    try:
        commit = subprocess.run(["git", "-C", str(Path(__file__).parent), "rev-parse", "--short",
                                 "HEAD"], capture_output=True, text=True).stdout.strip() or None
    except OSError:  # no git: the date and the command still say what ran
        commit = None
    return {"command": shlex.join(words), "commit": commit,
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def add_output_arguments(p, out: str, block: str) -> None:
    """--seed, --out and --markdown of a bench that reports as this one does; `block`: what its
    Markdown holds after the command, date, commit, CPU and flags."""
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path(out), help="write the JSON here")
    p.add_argument("--markdown", type=Path, default=None,
                   help="also write a Markdown block for docs/benchmarks.md here: command, "
                        f"date, commit, CPU and flags, {block}")


def _labels(size: dict) -> dict[str, str]:
    return {k: v[0].format(**size) for k, v in METRICS.items()}


def machine_line(r: dict) -> str:
    """CPU model, flags, threads, and the read bandwidth where `r` measured it."""
    m = r["machine"]
    flags = " ".join(f for f, on in m["cpu_flags"].items() if on) or "none of " + ", ".join(m["cpu_flags"])
    threads = f"{m['threads']} thread{'s' if m['threads'] != 1 else ''}"
    line = f"{m['cpu_model']}; flags: {flags}; {threads}"
    if "read_bandwidth_bytes_per_s" not in r:
        return line
    bw = " / ".join(f"{b / 1e9:.1f}" for b in spread(r["read_bandwidth_bytes_per_s"]))
    return (f"{line}; read bandwidth {bw} GB/s (min / median / max of "
            f"{len(r['read_bandwidth_bytes_per_s'])} runs)")


def _peer_lines(r: dict) -> list[str]:
    """Where each peer came from and, for a build, the options it was built with."""
    lines = []
    for name, info in r["peers"].items():
        where = info.get("bin_dir") or info.get("python")
        flags = info.get("build_flags")
        lines.append(f"{name}: {where}" + (f", built with {' '.join(flags)}" if flags else ""))
    return lines + [f"skipped {name}: {why}" for name, why in r["skipped"].items()]


def print_table(r: dict) -> None:
    print(f"\n{machine_line(r)}")
    for line in _peer_lines(r):
        print(line)
    label = _labels(r["sizes"])
    print(f"\n{'tool format':24} {'metric':18} {'min / median / max':>28}")
    for key, (lo, mid, hi) in r["summary"].items():
        tool, fmt, metric = key.split(" ")
        print(f"{tool + ' ' + fmt:24} {label[metric]:18} {lo:8.1f} / {mid:8.1f} / {hi:8.1f} "
              f"{METRICS[metric][1]}")
    if r["rows"]:
        print(f"\n{'graft / peer':32} {'metric':18} {'ratio min / median / max':>26}")
    for row in r["rows"]:
        lo, mid, hi = row["ratio"]
        name = f"{row['graft_scheme']} / {row['peer']} {row['format']}"
        print(f"{name:32} {label[row['metric']]:18} {lo:7.2f}x / {mid:6.2f}x / {hi:6.2f}x")


def markdown(r: dict) -> str:
    """A block to paste into docs/benchmarks.md as it is: provenance, then one table row per
    (peer, format, metric) with both tools' min / median / max and the ratio's."""
    label = _labels(r["sizes"])
    lines = [f"{r['date']}, commit {r['commit'] or 'unknown'}: {machine_line(r)}.", "",
             "```bash", r["command"], "```", ""]
    lines += [f"- {line}" for line in _peer_lines(r)]
    if not r["rows"]:  # no peer ran: graft's own figures
        lines += ["", "| tool, format | metric | min / median / max |", "| --- | --- | --- |"]
        for key, v in r["summary"].items():
            tool, fmt, metric = key.split(" ")
            lines.append(f"| {tool} {fmt} | {label[metric]} ({METRICS[metric][1]}) | "
                         + " / ".join(f"{x:.1f}" for x in v) + " |")
        return "\n".join(lines) + "\n"
    lines += ["", "| peer, format | metric | graft | peer | graft / peer |",
              "| --- | --- | --- | --- | --- |"]
    for row in r["rows"]:
        g, p = (" / ".join(f"{v:.1f}" for v in row[k]) for k in ("graft", "peer_values"))
        q = " / ".join(f"{v:.2f}x" for v in row["ratio"])
        lines.append(f"| {row['peer']} {row['format']} (graft {row['graft_scheme']}) | "
                     f"{label[row['metric']]} ({row['unit']}) | {g} | {p} | {q} |")
    return "\n".join(lines) + "\n"
