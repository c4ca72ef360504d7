"""`graft bench train CONFIG`: align-run samples/s and peak memory, with and without the
feature cache, in one command. Each variant runs in its own process so peak memory is its own.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import tempfile
from pathlib import Path

from graft.benchmarks.cli_args import out_file, positive_int


def add_arguments(parser) -> None:
    parser.add_argument("config", help="GraftSpec YAML")
    parser.add_argument("--steps", type=positive_int, default=20, help="optimizer steps per variant")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", type=out_file, default=None,
                        help="write the JSON result here (an existing file is replaced)")


def _variant(config: str, overrides: list[str], queue) -> None:
    import resource

    import torch

    from graft.run_dir import RunDir
    from graft.spec import GraftSpec
    from graft.train.loop import train

    spec = GraftSpec.load(config, overrides)
    run = train(spec)
    rows = [json.loads(ln) for ln in RunDir(run).metrics_file.read_text().splitlines() if ln]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    if torch.cuda.is_available():
        peak = torch.cuda.max_memory_allocated()
    summary = json.loads(RunDir(run).train_summary.read_text())
    queue.put({"samples_per_s": rows[-1]["samples_per_s"], "peak_memory_bytes": peak,
               "feature_cache": summary["feature_cache"], "steps": summary["steps"]})


def _run(config, overrides) -> dict:
    from graft.errors import GraftError

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_variant, args=(config, overrides, queue))
    proc.start()
    proc.join()
    if proc.exitcode != 0:  # its own error is printed above; the spec was checked already
        raise GraftError(f"a training variant failed (exit {proc.exitcode}, its error is above) "
                         f"with --set {' --set '.join(overrides)}")
    return queue.get()


def run(args) -> int:
    from graft.spec import GraftSpec

    with tempfile.TemporaryDirectory(prefix="graft-bench-train-") as tmp:
        base = list(args.overrides) + [f"train.max_steps={args.steps}", "train.log_every=1",
                                       "train.save_every=0"]
        # a bad CONFIG or --set is one line here, not a traceback in each child process
        GraftSpec.load(args.config, base + ["train.feature_cache=null", f"output_dir={tmp}/a"])
        cache = f"train.feature_cache={tmp}/features"
        results = {
            "no_cache": _run(args.config, base + ["train.feature_cache=null", f"output_dir={tmp}/a"]),
            "cache_cold": _run(args.config, base + [cache, f"output_dir={tmp}/b"]),
            "cache_warm": _run(args.config, base + [cache, f"output_dir={tmp}/c"]),
        }
    ref = results["no_cache"]["samples_per_s"]
    results["speedup_warm_vs_no_cache"] = results["cache_warm"]["samples_per_s"] / ref
    print(f"{'variant':<12} {'samples/s':>10} {'peak MiB':>10} {'cache hits':>10}")
    for name in ("no_cache", "cache_cold", "cache_warm"):
        r = results[name]
        print(f"{name:<12} {r['samples_per_s']:>10.2f} {r['peak_memory_bytes'] / 2**20:>10.0f} "
              f"{r['feature_cache']['hits']:>10}")
    print(f"warm feature cache vs no cache: {results['speedup_warm_vs_no_cache']:.2f}x samples/s")
    if args.out:
        from graft.io import atomic_write_json

        atomic_write_json(Path(args.out), results)
    return 0
