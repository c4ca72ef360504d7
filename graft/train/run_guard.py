"""Before `graft train` loads anything: never replace a run the user did not ask to replace,
and resume only a run trained with the same spec (naming every field that differs)."""

from __future__ import annotations

import shutil
from pathlib import Path

from graft.errors import GraftConfigError
from graft.io import check_writable_dir
from graft.run_dir import SPEC_FILE, RunDir, is_run_dir
from graft.spec import GraftSpec

# Fields a resumed run may change: how often it logs, validates and saves, where it reports
# to and reads from, how the LLM is laid out over the ranks (checkpoints do not depend on it;
# batch_size may follow a change of ranks as long as the global batch stays, which the loop
# checks); the LLM itself is pinned by llm.sha256 instead of its path.
RESUME_MAY_CHANGE = {"output_dir", "llm.path", "llm.sha256", "train.save_every",
                     "train.keep_checkpoints", "train.log_every", "train.eval_every", "train.report_to",
                     "train.num_workers", "train.feature_cache", "train.sharding",
                     "train.cpu_offload", "train.device_memory", "train.batch_size"}


def clear_replaced(run_dir: Path, action: str) -> None:
    """Empty the run dir `check_run_dir` found to be replaced (--overwrite); else nothing."""
    if action == "replace":
        shutil.rmtree(run_dir)  # stale checkpoints would otherwise be found by a later --resume


def check_run_dir(spec: GraftSpec, resume: bool = False, overwrite: bool = False
                  ) -> tuple[Path, str]:
    """`plan_run_dir`, refused when the dir holds a run that is neither resumed nor to be
    overwritten (compared with the spec on resume); deletes nothing."""
    run_dir, action = plan_run_dir(spec, resume, overwrite)
    if action == "occupied":
        raise GraftConfigError(
            f"output_dir {run_dir} already holds a run; --resume continues it, --overwrite "
            "replaces it, --set output_dir=PATH trains into a new dir")
    return run_dir, action


def plan_run_dir(spec: GraftSpec, resume: bool = False, overwrite: bool = False) -> tuple[Path, str]:
    """(run dir, what `graft train` would do with it: new | resume | replace | occupied),
    deleting nothing; GraftConfigError where no flag could make the run go ahead."""
    run_dir = Path(GraftSpec.expand(spec.output_dir))
    if run_dir.exists() and not run_dir.is_dir():
        raise GraftConfigError(f"output_dir {run_dir} is a file; pick a folder with "
                               "--set output_dir=PATH")
    check_writable(run_dir)
    if resume:
        check_resume(spec, run_dir)
        return run_dir, "resume"
    if not run_dir.is_dir() or not any(run_dir.iterdir()):
        return run_dir, "new"
    if not is_run_dir(run_dir):
        raise GraftConfigError(
            f"output_dir {run_dir} is not empty and is not a run dir (no {SPEC_FILE}); pick a "
            "new one with --set output_dir=PATH")
    return run_dir, "replace" if overwrite else "occupied"


def describe_run_dir(run_dir: Path, action: str) -> str:
    """One line for --dry-run: what the real run would do with output_dir."""
    from graft.train.checkpoint import latest_checkpoint

    return {"new": f"output_dir {run_dir}: a new run would be written there",
            "resume": f"output_dir {run_dir}: --resume would continue from "
                      f"{latest_checkpoint(run_dir)}",
            "replace": f"output_dir {run_dir} holds a run: --overwrite would replace it",
            "occupied": f"output_dir {run_dir} already holds a run: the real run needs --resume "
                        "(continue it) or --overwrite (replace it), or --set output_dir=PATH",
            }[action]


PSEUDO_FILESYSTEMS = ("/proc", "/sys", "/dev")  # kernel views: files there are not files


def check_writable(run_dir: Path) -> None:
    """GraftConfigError unless a file can be created in `run_dir` (made if missing, then
    removed again with the probe if it was new): minutes of loading are not spent on a run
    that cannot be saved."""
    resolved = run_dir.resolve()
    for root in PSEUDO_FILESYSTEMS:
        if resolved == Path(root) or Path(root) in resolved.parents:
            raise GraftConfigError(f"output_dir {run_dir} is under {root}, a kernel "
                                   "pseudo-filesystem; pick a folder on a disk with --set "
                                   "output_dir=PATH")
    missing = [p for p in [resolved, *resolved.parents] if not p.exists()]
    try:
        check_writable_dir(resolved, "output_dir", "pick another folder with --set "
                                                   "output_dir=PATH")
    finally:
        for new in missing:  # deepest first: the dirs this probe made
            if new.is_dir():
                try:
                    new.rmdir()
                except OSError:
                    break


def check_resume(spec: GraftSpec, run_dir: Path) -> None:
    from graft.train.checkpoint import latest_checkpoint

    if not is_run_dir(run_dir):
        raise GraftConfigError(f"--resume: {run_dir} has no {SPEC_FILE} (no run was started "
                               "there); drop --resume to start a new run")
    if latest_checkpoint(run_dir) is None:
        raise GraftConfigError(
            f"--resume: {run_dir} holds a run but no complete checkpoint under "
            f"{RunDir(run_dir).checkpoints_dir} (it stopped before train.save_every steps); "
            "start it again with --overwrite")
    saved = RunDir(run_dir).load_spec()
    diffs = [f"{k} ({saved_v!r} in the run, {new_v!r} now)"
             for k, saved_v, new_v in spec_diff(saved.to_dict(), spec.to_dict())
             if k not in RESUME_MAY_CHANGE]
    if diffs:
        raise GraftConfigError(
            f"--resume: the spec differs from {RunDir(run_dir).spec_file} in {'; '.join(diffs)}; "
            "resume with the same values, or train a new run with --set output_dir=PATH")
    if spec.llm.sha256 is None:  # train() then checks the weights are the ones trained on
        spec.llm.sha256 = saved.llm.sha256


def spec_diff(a: dict, b: dict, prefix: str = "") -> list[tuple[str, object, object]]:
    """(dotted key, value in a, value in b) for every leaf that differs."""
    out = []
    for key in sorted(set(a) | set(b), key=str):
        va, vb = a.get(key), b.get(key)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += spec_diff(va, vb, f"{prefix}{key}.")
        elif va != vb:
            out.append((f"{prefix}{key}", va, vb))
    return out
