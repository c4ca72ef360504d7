"""pareto.png: quality against decode tokens/s and against weight bytes, every measured point,
the front, fp32 and the chosen one; a third panel puts measured against additively predicted
quality (points off the diagonal are interactions between groups)."""

from __future__ import annotations

from pathlib import Path


def plot_pareto(points: list[dict], front: list[dict], chosen: dict | None, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a server
    import matplotlib.pyplot as plt

    done = [p for p in points if p.get("complete")]
    keys = {p["key"] for p in front}
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, (field, label, scale) in zip(axes[:2], [("tokens_per_s", "decode tokens/s (batch 1)", 1.0),
                                                    ("weight_bytes", "weight MB read per token", 1e-6)]):
        ax.scatter([p[field] * scale for p in done], [p["quality"] for p in done], s=14,
                   c="0.7", label="measured")
        pts = sorted(front, key=lambda p: p[field])
        ax.plot([p[field] * scale for p in pts], [p["quality"] for p in pts], "o-", c="C0",
                ms=5, label="Pareto front")
        for p in done:
            if p["key"] == "fp32" or (chosen is not None and p["key"] == chosen["key"]):
                mark = ("s", "C3", "fp32") if p["key"] == "fp32" else ("*", "C2", "chosen")
                ax.plot(p[field] * scale, p["quality"], mark[0], c=mark[1], ms=12, label=mark[2])
        ax.set_xlabel(label)
        ax.set_ylabel("quality (mean task score, search split)")
        ax.legend(fontsize=8)
    pred = [p for p in done if p.get("predicted_quality") is not None]
    ax = axes[2]
    ax.scatter([p["predicted_quality"] for p in pred], [p["quality"] for p in pred], s=14,
               c=["C0" if p["key"] in keys else "0.6" for p in pred])
    lo = min([p["quality"] for p in pred] + [p["predicted_quality"] for p in pred], default=0.0)
    hi = max([p["quality"] for p in pred] + [p["predicted_quality"] for p in pred], default=1.0)
    ax.plot([lo, hi], [lo, hi], "--", c="0.4", lw=1)
    ax.set_xlabel("additive prediction")
    ax.set_ylabel("measured")
    ax.set_title("above the line: errors cancel; below: they compound", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
