"""tuned.png: throughput (output tokens per second of engine stepping: what the configuration
sustains) against p99 TTFT for every measured point, the SLO's TTFT bound
as a line, the default configuration and the chosen one marked."""

from __future__ import annotations

from pathlib import Path


def plot_points(points: list[dict], slo: dict, chosen: dict | None, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a server
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    sizes = sorted({p["requests"] for p in points})
    for k, n in enumerate(sizes):
        pts = [p for p in points if p["requests"] == n and p["summary"]["ttft_ms"]["p99"] is not None]
        ax.scatter([p["summary"]["ttft_ms"]["p99"] for p in pts],
                   [p["summary"]["capacity_tokens_per_s"] for p in pts], s=16 + 12 * k,
                   c=[f"C{k}" if p["meets_slo"] else "0.75" for p in pts], edgecolors=f"C{k}",
                   label=f"first {n} requests" + (" (full trace)" if n == sizes[-1] else ""))
    full = [p for p in points if p["requests"] == sizes[-1]] if sizes else []
    for key, marker, color, name in (("default", "s", "C3", "default"),
                                     (chosen["key"] if chosen else None, "*", "C2", "chosen")):
        p = next((q for q in full if q["key"] == key), None)
        if p is not None and p["summary"]["ttft_ms"]["p99"] is not None:
            ax.plot(p["summary"]["ttft_ms"]["p99"], p["summary"]["capacity_tokens_per_s"], marker,
                    c=color, ms=13, mfc="none", mew=2, label=name)
    if "ttft_p99_ms" in slo:
        ax.axvline(slo["ttft_p99_ms"], ls="--", c="C3", lw=1, label="SLO: p99 TTFT")
    ax.set_xlabel("p99 time to first token (ms)")
    ax.set_ylabel("output tokens/s while the engine steps")
    ax.set_title("graft tune: filled points meet the SLO, grey ones miss it", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
