"""Task definitions: the YAML schema, its loader with clear errors, and the task registry."""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

from graft.errors import GraftConfigError
from graft.io import read_yaml
from graft.evals.metrics import METRICS

TASKS_DIR = Path(__file__).parent / "tasks"


@dataclass
class Generation:
    max_new_tokens: int = 32  # answer length cap
    temperature: float = 0.0  # 0 = greedy; only greedy requests are cached


@dataclass
class TaskSpec:
    name: str = ""  # registry name, `graft eval --tasks NAME`
    version: int = 1  # bump when data, prompt or scoring change: part of the cache key
    description: str = ""  # one line for `graft eval --list`
    data: str = ""  # JSONL file, relative to the data root
    image_root: str = "."  # folder image paths in the JSONL are relative to (under the data root)
    data_root: str | None = None  # default data root, relative to this YAML; --data-root overrides
    prompt: str = "{question}"  # user text; {field} = JSONL field, {options} = lettered options
    system: str | None = None  # optional system message
    generation: Generation = field(default_factory=Generation)  # sampling settings
    metrics: list[str] = field(default_factory=lambda: ["exact_match"])  # names in METRICS
    id_field: str = "id"  # JSONL field with a unique sample id
    image_field: str = "image"  # JSONL field with one image path or a list of them
    answer_field: str = "answer"  # JSONL field with the target (string or list of strings)
    options_field: str = "options"  # JSONL field with {letter: text} or a list of texts
    circular: bool = False  # ask each multiple-choice question once per rotation of its options
    reference: str = "data"  # "data": targets from the JSONL; "base_llm": the frozen LLM's answers
    hooks: str | None = None  # Python file (relative to this YAML) with process_sample/process_prediction
    source: str = ""  # the YAML file this spec was read from (filled by the loader)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _check_keys(raw: dict, cls, where: str) -> None:
    allowed = {f.name for f in dataclasses.fields(cls)} - {"source"}
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise GraftConfigError(
            f"{where}: unknown key(s) {unknown}; allowed keys are {sorted(allowed)}"
        )


_TYPES = {"name": str, "version": int, "description": str, "data": str, "image_root": str,
          "data_root": (str, type(None)), "prompt": str, "system": (str, type(None)), "metrics": (list, str),
          "id_field": str, "image_field": str, "answer_field": str, "options_field": str,
          "circular": bool, "reference": str, "hooks": (str, type(None)),
          "max_new_tokens": int, "temperature": (int, float)}


def _check_types(raw: dict, where: str) -> None:
    for key, value in raw.items():
        want = _TYPES.get(key)
        if want is not None and (not isinstance(value, want) or (want is int and isinstance(value, bool))):
            names = want.__name__ if isinstance(want, type) else " or ".join(t.__name__ for t in want)
            raise GraftConfigError(f"{where}: {key!r} must be {names}, got {value!r}")


def parse_task(raw: dict, source: str) -> TaskSpec:
    """Build a TaskSpec from a YAML mapping; every mistake names the file and the key."""
    if not isinstance(raw, dict):
        raise GraftConfigError(f"{source}: a task file must be a YAML mapping of keys")
    _check_keys(raw, TaskSpec, source)
    raw = dict(raw)
    gen = raw.pop("generation", None) or {}
    if not isinstance(gen, dict):
        raise GraftConfigError(f"{source}: 'generation' must be a mapping (max_new_tokens, temperature)")
    _check_keys(gen, Generation, f"{source}: generation")
    _check_types(raw, source)
    _check_types(gen, f"{source}: generation")
    spec = TaskSpec(**raw, generation=Generation(**gen), source=source)
    if not spec.name:
        spec.name = Path(source).stem
    if not spec.data:
        raise GraftConfigError(f"{source}: 'data' is required (a JSONL file relative to the data root)")
    if isinstance(spec.metrics, str):
        spec.metrics = [spec.metrics]
    bad = [m for m in spec.metrics if m not in METRICS]
    if bad or not spec.metrics:
        raise GraftConfigError(f"{source}: metrics {bad or '[]'} unknown; choose from {sorted(METRICS)}")
    if spec.reference not in ("data", "base_llm"):
        raise GraftConfigError(f"{source}: reference must be 'data' or 'base_llm', got {spec.reference!r}")
    if spec.generation.max_new_tokens < 1 or spec.generation.temperature < 0:
        raise GraftConfigError(f"{source}: generation needs max_new_tokens >= 1 and temperature >= 0")
    return spec


def load_task_file(path: str | Path) -> TaskSpec:
    return parse_task(read_yaml(path, "task file"), str(path))


def list_tasks(tasks_dir: str | Path = TASKS_DIR) -> dict[str, TaskSpec]:
    """Every shipped task by name."""
    specs = [load_task_file(p) for p in sorted(Path(tasks_dir).glob("*.yaml"))]
    return {s.name: s for s in specs}


def get_task(name_or_path: str) -> TaskSpec:
    """A shipped task by name, or any task YAML by path."""
    if name_or_path.endswith((".yaml", ".yml")) or Path(name_or_path).is_file():
        return load_task_file(name_or_path)
    path = TASKS_DIR / f"{name_or_path}.yaml"
    if path.is_file():
        return load_task_file(path)
    names = ", ".join(sorted(list_tasks()))
    raise GraftConfigError(f"unknown task {name_or_path!r}; shipped tasks: {names} (or pass a YAML path)")


def resolve_data_root(spec: TaskSpec, data_root: str | Path | None) -> Path:
    if data_root is not None:
        return Path(data_root).expanduser()
    if spec.data_root is None:
        raise GraftConfigError(
            f"task {spec.name} ships no data: pass --data-root DIR (python: data_root=...), "
            f"the folder that holds {spec.data}"
        )
    return (Path(spec.source).parent / spec.data_root).resolve()


def load_hooks(spec: TaskSpec) -> dict:
    """process_sample / process_prediction functions from the task's hook file, if any."""
    if not spec.hooks:
        return {}
    path = Path(spec.source).parent / spec.hooks
    if not path.is_file():
        raise GraftConfigError(f"{spec.source}: hooks file {path} does not exist")
    module_spec = importlib.util.spec_from_file_location(f"graft_task_hooks_{spec.name}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return {k: getattr(module, k) for k in ("process_sample", "process_prediction") if hasattr(module, k)}
