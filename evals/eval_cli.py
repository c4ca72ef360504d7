"""`graft eval`: run tasks on a model or endpoint, or `--list` the tasks (`graft eval compare
A B`: compare_cli.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from graft.cli_types import number_in
from graft.serving.engine.engine_args import add_engine_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--model", help="run dir (graft.yaml), plain HF LLM dir or GGUF file")
    target.add_argument("--endpoint", help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--tasks", default="", help="comma-separated task names or YAML paths")
    parser.add_argument("--list", action="store_true", help="list the shipped tasks and exit")
    parser.add_argument("--limit", type=int, default=None, help="first N questions per task")
    parser.add_argument("--out", default=None,
                        help="folder for results.json and samples_<task>.jsonl (default: a new "
                        "RUN_DIR/eval/<time>-<tasks>/ for a run dir, else runs/eval/<time>-<model>-<tasks>/)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace results.json in an --out folder that already has one")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress bars (they are off anyway when stderr is not a terminal)")
    parser.add_argument("--backend", default="hf", choices=["hf", "engine"], help="how --model runs")
    # --device runs --model on either backend; the rest need --backend engine (--seed here is
    # the bootstrap's and the samples', not the engine's default)
    add_engine_args(parser, exclude=("seed",))
    parser.add_argument("--data-root", default=None, help="folder task data paths are relative to")
    parser.add_argument("--base-llm", default=None, help="frozen LLM dir for reference: base_llm tasks")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap and sampling seed")
    parser.add_argument("--bootstrap", type=int, default=1000,
                        help="bootstrap resamples for CIs (0: no CI)")
    parser.add_argument("--cache", default=None, help="response cache file (default ~/.cache/graft/...)")
    parser.add_argument("--no-cache", action="store_true", help="always ask the model")
    parser.add_argument("--endpoint-model", default=None, help="model name sent to the endpoint")
    parser.add_argument("--concurrency", type=int, default=4, help="parallel endpoint requests")
    parser.add_argument("--retries", type=int, default=2, help="retries per failed endpoint request")
    parser.add_argument("--timeout", type=number_in(float, low=0.0, low_open=True), default=60.0,
                        help="seconds per endpoint request")


def _list() -> int:
    from graft.evals.report import format_table
    from graft.evals.task import list_tasks

    rows = [[s.name, ",".join(s.metrics), s.data_root or "(--data-root)", s.description]
            for s in list_tasks().values()]
    print(format_table(["task", "metrics", "data", "description"], rows))
    return 0


def run(args) -> int:
    from graft.errors import GraftConfigError

    if args.list:
        return _list()
    if not (args.model or args.endpoint):
        raise GraftConfigError("pass --model RUN_DIR or --endpoint URL (or --list; or `graft eval compare A B`)")
    from graft.evals.report import results_table
    from graft.evals.runner import run_eval

    if args.out and (Path(args.out) / "results.json").exists() and not args.overwrite:
        raise GraftConfigError(f"--out {args.out} already holds results.json; --overwrite "
                               "replaces it, or drop --out for a new dated folder")
    out = args.out or str(default_out_dir(args.endpoint or args.model, args.tasks))
    endpoint_options = {}
    if args.endpoint:
        endpoint_options = dict(model=args.endpoint_model, concurrency=args.concurrency,
                                retries=args.retries, timeout=args.timeout)
    results = run_eval(args.endpoint or args.model, tasks=args.tasks, data_root=args.data_root,
                       out_dir=out, limit=args.limit, backend=args.backend,
                       cache=False if args.no_cache else (args.cache or True), seed=args.seed,
                       n_boot=args.bootstrap, base_llm=args.base_llm, device=args.device,
                       quantization=args.quantization, progress=False if args.quiet else None,
                       engine_config=_engine_config(args),
                       **endpoint_options)
    print(results_table(results))
    print(f"wrote {Path(out) / 'results.json'}")
    return 0


def _engine_config(args):
    """The engine options for --backend engine; the HF backend takes --device only, so another
    engine option there is an error naming it (not silently ignored)."""
    from graft.errors import GraftConfigError
    from graft.serving import EngineConfig
    from graft.serving.engine.engine_args import changed_flags

    if args.endpoint:
        return None
    if args.backend != "engine":
        # --quantization has its own message in make_backend
        unused = changed_flags(args, ignore=("device", "quantization"))
        if unused:
            raise GraftConfigError(f"{' '.join(unused)} needs --backend engine (the HF backend "
                                   "runs the checkpoint with --device only)")
        return None
    return EngineConfig.from_args(args)


def default_out_dir(target: str, tasks: str, now=None) -> Path:
    """A new folder per eval, named by UTC time and tasks: under the run dir's eval/ for a run
    dir, else under runs/eval/ with the model's (or endpoint host's) name."""
    import re
    from datetime import datetime, timezone

    from graft.run_dir import RunDir, is_run_dir

    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%dT%H%M%SZ")
    names = "+".join(Path(t).stem for t in tasks.split(",") if t)[:80]
    if is_run_dir(target):
        base, name = RunDir(target).eval_dir, f"{stamp}-{names}"
    else:
        model = re.sub(r"^https?://", "", target.rstrip("/"))
        model = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(model).name if "://" not in target else model)
        base, name = Path("runs") / "eval", f"{stamp}-{model}-{names}"
    out, n = base / name, 1
    while out.exists():  # two evals in one second: never write into another's folder
        n += 1
        out = base / f"{name}-{n}"
    return out
