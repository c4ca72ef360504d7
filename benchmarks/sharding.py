"""`graft bench sharding CONFIG --ranks N`: one process against N ranks data parallel and N ranks
with the frozen LLM sharded (FSDP), all on the same global batch: memory each rank holds, peak
RSS / device memory, samples/s, and whether the losses agree. Each variant is a real launch
(`accelerate launch`), repeated --repeats times (min/median/max)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from graft.benchmarks.cli_args import out_file
from graft.benchmarks.report import spread

VARIANTS = ("one", "ddp", "fsdp")


def add_arguments(parser) -> None:
    from graft.cli_types import number_in

    parser.add_argument("config", help="GraftSpec YAML (its train.batch_size is per rank)")
    parser.add_argument("--ranks", type=number_in(int, 2), default=2, help="ranks of the ddp/fsdp variants")
    parser.add_argument("--steps", type=number_in(int, 1), default=10, help="optimizer steps per run")
    parser.add_argument("--repeats", type=number_in(int, 1), default=3, help="runs per variant")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", type=out_file, default=None,
                        help="write the JSON result here (an existing file is replaced)")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(config: str, ranks: int, overrides: list[str]) -> None:
    import torch

    env = dict(os.environ)
    args = ["-m", "graft.cli", "train", config] + [x for o in overrides for x in ("--set", o)]
    if ranks > 1:
        if not torch.cuda.is_available():
            env["ACCELERATE_USE_CPU"] = "true"
            env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // ranks)))
        args = ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(ranks),
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                "--main_process_port", str(_port()), *args]
    proc = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"graft train ({ranks} rank(s), {overrides}) failed:\n{tail}")


def _one_run(config: str, variant: str, ranks: int, args, out_dir: Path) -> dict:
    from graft.spec import GraftSpec

    batch = GraftSpec.load(config, args.overrides).train.batch_size
    n = 1 if variant == "one" else ranks
    sets = list(args.overrides) + [
        f"train.max_steps={args.steps}", "train.save_every=0", "train.log_every=1",
        f"train.batch_size={batch * ranks if variant == 'one' else batch}",
        f"train.sharding={'fsdp' if variant == 'fsdp' else 'none'}", f"output_dir={out_dir}"]
    _launch(config, n, sets)
    summary = json.loads((out_dir / "train_summary.json").read_text())
    rows = [json.loads(ln) for ln in (out_dir / "metrics.jsonl").read_text().splitlines() if ln]
    device = [m for m in summary["peak_device_memory_bytes_per_rank"] if m is not None]
    return {"ranks": n, "samples_per_s": summary["steps"] * batch * ranks / summary["train_seconds"],
            "llm_param_bytes": summary["llm_param_bytes"],
            "llm_bytes_per_rank_max": max(summary["llm_param_bytes_per_rank"]),
            "peak_rss_bytes_per_rank_max": max(summary["peak_rss_bytes_per_rank"]),
            "peak_rss_bytes_per_rank": summary["peak_rss_bytes_per_rank"],
            "peak_device_bytes_per_rank_max": max(device) if device else None,
            "losses": [r["loss"] for r in rows]}


def run(args) -> int:
    results: dict = {"ranks": args.ranks, "steps": args.steps, "repeats": args.repeats}
    with tempfile.TemporaryDirectory(prefix="graft-bench-sharding-") as tmp:
        runs = {v: [] for v in VARIANTS}
        for i in range(args.repeats):  # variants alternate, so drift hits each alike
            for v in VARIANTS:
                runs[v].append(_one_run(args.config, v, args.ranks, args, Path(tmp) / f"{v}{i}"))
    for v, rs in runs.items():
        results[v] = {**{k: rs[0][k] for k in ("ranks", "llm_param_bytes", "llm_bytes_per_rank_max",
                                               "peak_device_bytes_per_rank_max", "losses")},
                      "peak_rss_bytes_per_rank_runs": [r["peak_rss_bytes_per_rank"] for r in rs],
                      "samples_per_s": spread([r["samples_per_s"] for r in rs]),
                      "peak_rss_bytes_per_rank_max": spread([r["peak_rss_bytes_per_rank_max"] for r in rs])}
    ref = results["one"]["losses"]
    for v in ("ddp", "fsdp"):
        results[v]["max_loss_rel_diff_vs_one"] = max(
            abs(a - b) / abs(b) for a, b in zip(results[v]["losses"], ref))
        results[v]["samples_per_s_vs_one"] = (results[v]["samples_per_s"]["median"]
                                              / results["one"]["samples_per_s"]["median"])
    whole = results["one"]["llm_param_bytes"]
    print(f"LLM {whole / 2**20:.1f} MiB; {args.steps} steps x {args.repeats} runs per variant")
    print(f"{'variant':<10} {'LLM/rank':>10} {'share':>6} {'peak RSS/rank MiB (min/med/max)':>32} "
          f"{'samples/s (min/med/max)':>26} {'loss vs one':>11}")
    for v in VARIANTS:
        r = results[v]
        rss, sps = r["peak_rss_bytes_per_rank_max"], r["samples_per_s"]
        diff = r.get("max_loss_rel_diff_vs_one")
        print(f"{v + ' x' + str(r['ranks']):<10} {r['llm_bytes_per_rank_max'] / 2**20:>8.1f}Mi "
              f"{r['llm_bytes_per_rank_max'] / whole:>6.2f} "
              f"{rss['min'] / 2**20:>10.0f}/{rss['median'] / 2**20:.0f}/{rss['max'] / 2**20:.0f}"
              f"{'':>12}{sps['min']:>8.2f}/{sps['median']:.2f}/{sps['max']:.2f}"
              f"{'' if diff is None else f'{diff:>11.1e}'}")
    if args.out:
        from graft.io import atomic_write_json

        atomic_write_json(Path(args.out), results)
    return 0
