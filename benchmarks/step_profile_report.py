"""What `graft bench profile` prints and writes for docs/benchmarks.md: per category (then per
process and per thread) each server's share of its samples and its CPU-seconds, the servers
side by side, with the load's throughput and TTFT, under the run's provenance."""

from __future__ import annotations

from graft.benchmarks.peers_report import machine_line

# the load's figures: (key in load(), label, format)
LOAD = (("serve_output_tok_s", "output tok/s", "{:.1f}"), ("serve_ttft_p50_ms", "TTFT p50 ms", "{:.1f}"),
        ("serve_ttft_p99_ms", "TTFT p99 ms", "{:.1f}"), ("wall_s", "load wall s", "{:.2f}"))


def _cell(entry: dict | None) -> str:
    if not entry or not entry["samples"]:
        return "-"
    return f"{entry['share'] * 100:5.1f}% ({entry['cpu_s']:.2f} s)"


def rows(r: dict) -> list[tuple[str, list[str]]]:
    """(label, one cell per server): categories, then processes and threads, then the load."""
    servers = list(r["servers"].values())
    out = [(c, [_cell(s["categories"][c]) for s in servers]) for c in r["categories"]]
    out.append(("all samples", [f"{s['samples']} ({s['cpu_s']:.2f} CPU s)" for s in servers]))
    for kind in ("processes", "threads"):
        names = dict.fromkeys(n for s in servers for n in s[kind])
        out += [(f"{kind[:-2] if kind == 'processes' else 'thread'}: {n}",
                 [_cell(s[kind].get(n)) for s in servers]) for n in names]
    for key, label, fmt in LOAD:
        # no TTFT where no answer had visible text (a random checkpoint's tokens may not)
        out.append((label, ["-" if s["load"][key] is None else fmt.format(s["load"][key])
                            for s in servers]))
    # threads on a core on average; well under what the load keeps busy: py-spy fell behind
    out.append(("CPU s / load wall s", [f"{s['cpu_s'] / s['load']['wall_s']:.2f}" for s in servers]))
    out.append(("py-spy samples / errors",
                [f"{s['py_spy_samples']} / {s['py_spy_errors']}" for s in servers]))
    return out


def print_table(r: dict) -> None:
    print(f"\n{machine_line(r)}")
    for name, why in r["skipped"].items():
        print(f"skipped {name}: {why}")
    names = list(r["servers"])
    print(f"\n{'share of samples (CPU s)':34}" + "".join(f"{n:>24}" for n in names))
    for label, cells in rows(r):
        print(f"{label[:34]:34}" + "".join(f"{c:>24}" for c in cells))


def markdown(r: dict) -> str:
    """A block to paste into docs/benchmarks.md as it is."""
    names = list(r["servers"])
    lines = [f"{r['date']}, commit {r['commit'] or 'unknown'}: {machine_line(r)}.", "",
             "```bash", r["command"], "```", ""]
    if r["skipped"]:
        lines += [f"- skipped {name}: {why}" for name, why in r["skipped"].items()] + [""]
    lines += ["| share of samples (CPU s) | " + " | ".join(names) + " |",
              "| --- |" + " --- |" * len(names)]
    lines += [f"| {label} | " + " | ".join(c.strip() for c in cells) + " |"
              for label, cells in rows(r)]
    return "\n".join(lines) + "\n"
