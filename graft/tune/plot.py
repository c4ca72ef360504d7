"""tuned.png: throughput (output tokens per second of engine stepping: what the configuration
sustains) against p99 TTFT for every measured point, the SLO's TTFT bound as a line, each
finalist's median with its spread (min to max of its replays) as a bar, the chosen one marked."""

from __future__ import annotations

from pathlib import Path


def plot_points(points: list[dict], slo: dict, finals: list[dict], chosen: dict | None,
                path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a server
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5))
    sizes = sorted({p["requests"] for p in points})
    for k, n in enumerate(sizes):
        pts = [p for p in points if p["requests"] == n and p["summary"]["ttft_ms"]["p99"] is not None]
        ax.scatter([p["summary"]["ttft_ms"]["p99"] for p in pts],
                   [p["summary"]["capacity_tokens_per_s"] for p in pts], s=16 + 12 * k,
                   c=[f"C{k}" if p["meets_slo"] else "0.75" for p in pts], edgecolors=f"C{k}",
                   alpha=0.6, label=f"first {n} requests" + (" (full trace)" if n == sizes[-1] else ""))
    for k, f in enumerate(finals):
        x = f["summary"]["ttft_ms"]["p99"]
        if x is None:
            continue
        is_chosen = chosen is not None and f["key"] == chosen["key"]
        ax.errorbar(x, f["median"], yerr=[[f["median"] - f["min"]], [f["max"] - f["median"]]],
                    fmt="*" if is_chosen else "s", ms=14 if is_chosen else 9, mfc="none", mew=2,
                    capsize=5, c=f"C{len(sizes) + k}",
                    label=f"{'chosen: ' if is_chosen else ''}{f['key']}: median {f['median']:.1f} "
                          f"[{f['min']:.1f}-{f['max']:.1f}] of {f['replays']}")
    if "ttft_p99_ms" in slo:
        ax.axvline(slo["ttft_p99_ms"], ls="--", c="C3", lw=1, label="SLO: p99 TTFT")
    ax.set_xlabel("p99 time to first token (ms)")
    ax.set_ylabel("output tokens/s while the engine steps")
    ax.set_title("graft tune: filled points meet the SLO, grey ones miss it; bars: a finalist's "
                 "replays, min to max", fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
