"""results.json / samples_<task>.jsonl writers (atomic), the run fingerprint and the printed table."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from graft.errors import GraftConfigError, GraftDataError
from graft.io import OutputPathError, atomic_write_json, atomic_write_text, check_output_path
from graft.loads import json_loads

_PACKAGES = ("graft-vlm", "torch", "transformers", "timm", "numpy", "pillow", "httpx", "safetensors", "peft")
REPO_DIR = Path(__file__).resolve().parents[1]


def git_state(repo: Path = REPO_DIR) -> dict:
    def git(*args):
        out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=20)
        return out.stdout.strip() if out.returncode == 0 else None

    try:
        commit = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.TimeoutExpired):
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": None if dirty is None else bool(dirty)}


def package_versions() -> dict:
    out = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def hardware() -> dict:
    info = {"machine": platform.machine(), "system": platform.system(), "processor": platform.processor(),
            "cpu_count": os.cpu_count()}
    torch = sys.modules.get("torch")  # only if a backend already loaded it: no import cost for endpoints
    if torch is not None and torch.cuda.is_available():
        info["cuda"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        info["torch_threads"] = torch.get_num_threads()
    elif torch is not None:
        info["torch_threads"] = torch.get_num_threads()
    return info


def now_utc() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def check_out_dir(path: str | Path, flag: str = "--out") -> None:
    """Before any work: `path` must be a folder, or creatable as one, that this process can
    write (probed in its nearest existing folder). Creates nothing."""
    try:
        check_output_path(path, "dir")
    except OutputPathError as err:
        raise GraftConfigError(f"{flag}: {err}") from None


def write_samples(out_dir: Path, task: str, rows: list[dict]) -> Path:
    path = out_dir / f"samples_{task}.jsonl"
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


def write_results(out_dir: Path, results: dict) -> Path:
    path = out_dir / "results.json"
    atomic_write_json(path, results)
    return path


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise GraftDataError(f"{path}: cannot read it ({err}); point at a `graft eval --out` folder") from None


def read_results(run: str | Path) -> dict:
    """A results.json (or the folder holding one), checked to be what `graft eval` writes."""
    path = Path(run)
    path = path / "results.json" if path.is_dir() else path
    if not path.is_file():
        raise GraftDataError(f"{path} does not exist: point at an eval --out folder or its results.json")
    results = json_loads(_read_text(path), str(path), GraftDataError)
    tasks = results.get("tasks") if isinstance(results, dict) else None
    bad = not isinstance(tasks, dict) or any(
        not isinstance(t, dict) or not isinstance(t.get("metrics"), list) or not t["metrics"]
        for t in tasks.values())
    if bad:
        raise GraftDataError(f"{path} is not a `graft eval` results.json (no tasks.NAME.metrics); "
                             "point at a `graft eval --out` folder or rerun that eval")
    return results


def read_samples(run_dir: Path, task: str) -> list[dict]:
    """The rows of samples_<task>.jsonl; a bad line (a truncated file) is named by number."""
    path = run_dir / f"samples_{task}.jsonl"
    if not path.is_file():
        raise GraftDataError(f"{path} is missing: compare needs the samples files next to results.json")
    rows = []
    for lineno, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        row = json_loads(line, f"{path}:{lineno}", GraftDataError)
        if not isinstance(row, dict) or "id" not in row or not isinstance(row.get("scores"), dict):
            raise GraftDataError(f"{path}:{lineno}: not a `graft eval` sample row (an object with "
                                 "id and scores); rerun that eval")
        rows.append(row)
    return rows


def format_table(headers: list[str], rows: list[list]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_ci(ci: list[float] | None, fmt: str = ".4f") -> str:
    """"[lo, hi]", or "-" for a run with --bootstrap 0 (no interval)."""
    return "-" if ci is None else f"[{ci[0]:{fmt}}, {ci[1]:{fmt}}]"


def results_table(results: dict) -> str:
    rows = []
    for name, t in results["tasks"].items():
        rows.append([name, t["metric"], f"{t['score']:.4f}", format_ci(t["ci"]), t["n"], t["n_errors"]])
    return format_table(["task", "metric", "score", "95% CI", "n", "errors"], rows)
