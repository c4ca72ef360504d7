"""run_eval: tasks through a backend (with the response cache), scores with bootstrap CIs, files."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from graft.errors import GraftConfigError, GraftError
from graft.evals.backends import Request, Result, make_backend
from graft.evals.cache import ResponseCache, cache_key
from graft.evals.dataset import Sample, load_samples
from graft.evals.metrics import METRICS
from graft.evals.report import (
    check_out_dir,
    git_state,
    hardware,
    now_utc,
    package_versions,
    write_results,
    write_samples,
)
from graft.evals.stats import bootstrap_ci, check_n_boot, columns_of, group_index
from graft.evals.task import TaskSpec, get_task, load_hooks


def build_requests(spec: TaskSpec, samples: list[Sample], seed: int) -> list[Request]:
    system = [{"role": "system", "content": spec.system}] if spec.system else []
    gen = spec.generation
    return [Request(system + [{"role": "user", "content": s.prompt}], list(s.images),
                    gen.max_new_tokens, gen.temperature, seed) for s in samples]


def progress_chunk(backend) -> int:
    """Requests per backend call when progress is shown: the engine's own batch, a few rounds
    of an endpoint's concurrency (each call waits for its slowest request), else one."""
    chunk = getattr(backend, "chunk", None)
    if isinstance(chunk, int) and chunk > 0:
        return chunk
    concurrency = getattr(backend, "concurrency", None)
    if isinstance(concurrency, int) and concurrency > 0:
        return 4 * concurrency
    return 1


def generate_cached(backend, cache: ResponseCache | None, spec: TaskSpec, samples: list[Sample],
                    requests: list[Request], progress=None) -> list[Result]:
    """Answers in sample order; cache hits skip the backend. Misses go in one batch, or with
    `progress(n)` (called as answers arrive) in chunks of `progress_chunk(backend)`."""
    results: list[Result | None] = [None] * len(requests)
    keys = [cache_key(spec.name, spec.version, s.id, backend.identity, r) for s, r in zip(samples, requests)]
    todo = []
    for i, (key, req) in enumerate(zip(keys, requests)):
        hit = cache.get(key) if cache is not None and cache.cacheable(req) else None
        if hit is not None:
            results[i] = hit
        else:
            todo.append(i)
    if progress is not None:
        progress(len(requests) - len(todo))
    step = progress_chunk(backend) if progress is not None else max(len(todo), 1)
    for start in range(0, len(todo), step):
        part = todo[start:start + step]
        for i, res in zip(part, backend.generate([requests[i] for i in part])):
            results[i] = res
            if cache is not None and cache.cacheable(requests[i]):
                cache.put(keys[i], res)
        if progress is not None:
            progress(len(part))
    return results


def _bar(show: bool):
    """A factory of tqdm bars on stderr (one per task and pass), or of None when hidden."""
    from contextlib import contextmanager, nullcontext

    if not show:
        return lambda desc, total: nullcontext(None)

    @contextmanager
    def bar(desc: str, total: int):
        import sys

        from tqdm.auto import tqdm

        # mininterval=0: every update is drawn (one per backend call, so few); tqdm's default
        # skips updates within 0.1 s of the last, and a fast task would never show its end
        with tqdm(total=total, desc=desc, unit="q", file=sys.stderr, leave=False,
                  mininterval=0) as b:
            yield b.update
    return bar


def _summary(values: list[float | None]) -> dict | None:
    vals = np.array([v for v in values if v is not None], dtype=float)
    if not len(vals):
        return None
    return {"mean": float(vals.mean()), "p50": float(np.percentile(vals, 50)), "p95": float(np.percentile(vals, 95))}


def score_task(spec: TaskSpec, samples: list[Sample], predictions: list[str | None],
               n_boot: int, seed: int) -> tuple[dict, list[dict]]:
    """Task-level scores with CIs, and the per-sample score dicts."""
    per_sample: list[dict] = [{} for _ in samples]
    scores: dict[str, dict] = {}
    groups = group_index([s.group or s.id for s in samples])
    for name in spec.metrics:
        metric = METRICS[name]
        records = metric.score(predictions, samples)
        for row, rec in zip(per_sample, records):
            row.update(rec)
        columns = columns_of(records)
        point = metric.aggregate(columns, groups)
        ci = bootstrap_ci(metric.aggregate, columns, groups, n_boot=n_boot, seed=seed)
        for key, value in point.items():
            scores.setdefault(key, {"value": value, "ci": ci[key]})
    primary = METRICS[spec.metrics[0]].primary
    summary = {"metric": primary, "score": scores[primary]["value"], "ci": scores[primary]["ci"], "scores": scores}
    if "accuracy" in scores:
        summary["accuracy"] = scores["accuracy"]["value"]
    return summary, per_sample


def _reference_backend(state: dict, backend, base_llm, device: str):
    if "ref" not in state:
        path = base_llm or getattr(backend, "base_llm", None)
        if not path:
            raise GraftConfigError(
                "a task with reference: base_llm compares against the frozen LLM: pass --base-llm DIR "
                "(python: base_llm=...), the plain HF LLM dir")
        quantization = getattr(backend, "quantization", None)
        if quantization is not None:  # the graft's effect, not the quantization's: same weights
            from graft.evals.backends.engine import EngineBackend

            state["ref"] = EngineBackend(path, config=backend.engine.config)
            return state["ref"]
        from graft.evals.backends.hf import PlainLLMBackend

        same = isinstance(backend, PlainLLMBackend) and Path(backend.base_llm) == Path(path)
        state["ref"] = backend if same else PlainLLMBackend(path, device=device)
    return state["ref"]


def eval_task(spec: TaskSpec, samples: list[Sample], model, reference, cache: ResponseCache | None,
              n_boot: int, seed: int, bar=None) -> tuple[dict, list[dict]]:
    """One task: (reference answers,) model answers, scores; returns (summary, sample rows).
    `bar(desc, total)`: a context giving a progress callback (see `_bar`), or None."""
    bar = bar or _bar(False)
    requests = build_requests(spec, samples, seed)
    if spec.reference == "base_llm":
        with bar(f"{spec.name} (base LLM)", len(requests)) as tick:
            refs = generate_cached(reference(), cache, spec, samples, requests, tick)
        for sample, res in zip(samples, refs):
            if res.error is not None:
                raise GraftError(f"task {spec.name}, sample {sample.id}: the base LLM failed: {res.error}")
            sample.target = res.prediction
    with bar(spec.name, len(requests)) as tick:
        answers = generate_cached(model, cache, spec, samples, requests, tick)
    hooks = load_hooks(spec)
    preds = [a.prediction for a in answers]
    if "process_prediction" in hooks:
        preds = [p if p is None else hooks["process_prediction"](p, s) for p, s in zip(preds, samples)]
    summary, per_sample = score_task(spec, samples, preds, n_boot, seed)
    summary.update({
        "n": len(samples), "n_questions": len({s.group for s in samples}),
        "n_errors": sum(a.error is not None for a in answers), "n_cached": sum(a.cached for a in answers),
        "metrics": spec.metrics, "version": spec.version,
        # which official evaluator's code each score reproduces
        "definitions": {name: METRICS[name].definition for name in spec.metrics},
        "latency_s": _summary([a.latency for a in answers]), "ttft_s": _summary([a.ttft for a in answers]),
    })
    rows = [{"id": s.id, "group": s.group, "prompt": s.prompt, "images": [str(p) for p in s.images],
             "prediction": p, "target": s.target, "scores": sc, "ttft": a.ttft, "latency": a.latency,
             "error": a.error, "cached": a.cached} for s, p, sc, a in zip(samples, preds, per_sample, answers)]
    return summary, rows


def run_eval(model_or_backend, tasks: list[str], data_root=None, out_dir=None, limit: int | None = None,
             backend: str = "hf", cache: bool | str | Path | ResponseCache = True, seed: int = 0,
             n_boot: int = 1000, base_llm: str | None = None, device: str = "cpu", log=print,
             quantization=None, progress: bool | None = None, engine_config=None,
             **endpoint_options) -> dict:
    """Evaluate a model on tasks; returns the results dict (also written to out_dir/results.json).

    model_or_backend: a run dir, a plain HF LLM dir, an http(s) endpoint URL, a GraftedModel,
    or any object with `identity` and `generate(requests)`. `backend` picks "hf" or "engine"
    for directories, on `device` (`quantization`: the engine's weight scheme or quant.json;
    `engine_config`: every engine option, an EngineConfig). Tasks are shipped names or YAML
    paths. `base_llm` is the frozen LLM dir for `reference: base_llm` tasks (default: the one the model names).
    `progress`: a tqdm bar per task on stderr (None: only when stderr is a terminal).
    """
    if isinstance(tasks, str):
        tasks = [t for t in tasks.split(",") if t]
    if not tasks:
        raise GraftConfigError("no tasks given: pass --tasks a,b (see `graft eval --list`)")
    if limit is not None and limit < 1:
        raise GraftConfigError(f"--limit must be >= 1, got {limit}")
    check_n_boot(n_boot)
    if out_dir is not None:  # a file or unwritable place fails now, not after the first task
        check_out_dir(out_dir)
    specs = [get_task(t) for t in tasks]
    task_samples = [load_samples(s, data_root, limit) for s in specs]  # all data errors before any model load
    model = make_backend(model_or_backend, backend, device=device, quantization=quantization,
                         engine_config=engine_config, **endpoint_options)
    store = cache if isinstance(cache, ResponseCache) else (
        ResponseCache(None if cache is True else cache) if cache else None)
    state: dict = {}
    if progress is None:
        import sys

        progress = sys.stderr.isatty()
    bar = _bar(progress)
    named = isinstance(model_or_backend, (str, Path))
    is_url = named and str(model_or_backend).startswith(("http://", "https://"))
    results = {"tasks": {}, "config": {
        "model": str(model_or_backend) if named else type(model_or_backend).__name__,
        "backend": "endpoint" if is_url else backend,
        "model_identity": model.identity, "data_root": None if data_root is None else str(data_root),
        "limit": limit, "n_boot": n_boot, "base_llm": base_llm, "device": device,
        "quantization": None if quantization is None else str(quantization),
        "engine": model.engine.config.to_dict() if getattr(model, "engine", None) else None,
        "task_specs": {}},
        "seed": seed, "git": git_state(), "packages": package_versions(), "created": now_utc()}
    try:
        for spec, samples in zip(specs, task_samples):
            reference = lambda: _reference_backend(state, model, base_llm, device)  # noqa: E731
            summary, rows = eval_task(spec, samples, model, reference, store, n_boot, seed, bar)
            results["tasks"][spec.name] = summary
            results["config"]["task_specs"][spec.name] = spec.to_dict()
            if out_dir is not None:
                write_samples(Path(out_dir), spec.name, rows)
            if log:
                log(f"{spec.name}: {summary['metric']} {summary['score']:.4f} on {summary['n']} samples"
                    f" ({summary['n_errors']} failed, {summary['n_cached']} cached)")
    finally:
        if store is not None and store is not cache:
            store.close()
    results["hardware"] = hardware()
    if out_dir is not None:
        write_results(Path(out_dir), results)
    return results
