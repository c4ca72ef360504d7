"""Reads a task's JSONL + image folder into samples; errors name the file and line."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graft.errors import GraftDataError
from graft.loads import json_loads
from graft.image_prompt import IMAGE_MARKER, with_image_markers
from graft.evals.metrics.multiple_choice import rotate_options
from graft.evals.task import TaskSpec, load_hooks, resolve_data_root


@dataclass
class Sample:
    id: str  # unique within the task (circular rotations get "#r<k>")
    prompt: str  # user text; one <image> marker per image
    images: list[Path] = field(default_factory=list)
    target: Any = None  # str or list[str]; None until a base-LLM reference fills it
    options: dict[str, str] | None = None
    group: str = ""  # bootstrap cluster; rotations of one question share it
    rotation: int = 0  # which circular pass this is (0 = the options as written)
    where: str = ""  # file:line, for error messages


def _options(value, where: str) -> dict[str, str]:
    if isinstance(value, dict):
        return {str(k).strip().upper(): str(v) for k, v in value.items()}
    if isinstance(value, list):
        return {chr(ord("A") + i): str(v) for i, v in enumerate(value)}
    raise GraftDataError(f"{where}: options must be a {{letter: text}} mapping or a list of texts")


def _format(template: str, record: dict, where: str) -> str:
    try:
        return template.format(**record)
    except KeyError as err:
        raise GraftDataError(
            f"{where}: the prompt uses field {err.args[0]!r} that this line does not have"
        ) from None


def _check_decodes(path: Path, where: str, field_name: str) -> None:
    """Decode the file once (as a backend will): not an image, or truncated, fails here,
    before any model loads, instead of as a failed sample mid-run."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            im.load()
    except (OSError, ValueError, Image.DecompressionBombError) as err:
        raise GraftDataError(f"{where}: image {path} cannot be decoded ({err}) (field {field_name!r}); "
                             "replace the file or drop this line") from None


def _image_paths(record: dict, spec: TaskSpec, image_root: Path, where: str, checked: set[Path]) -> list[Path]:
    value = record.get(spec.image_field)
    if value in (None, "", []):
        return []
    paths = [value] if isinstance(value, str) else list(value)
    out = []
    for rel in paths:
        path = image_root / str(rel)
        if not path.is_file():
            raise GraftDataError(f"{where}: image {path} does not exist (field {spec.image_field!r})")
        if path not in checked:  # many questions share an image (POPE): decode each file once
            _check_decodes(path, where, spec.image_field)
            checked.add(path)
        out.append(path)
    return out


def _build(record: dict, spec: TaskSpec, image_root: Path, where: str, checked: set[Path]) -> list[Sample]:
    if spec.id_field not in record:
        raise GraftDataError(f"{where}: missing the id field {spec.id_field!r}")
    sid = str(record[spec.id_field])
    images = _image_paths(record, spec, image_root, where, checked)
    target = record.get(spec.answer_field)
    if isinstance(target, list):  # VQAv2 files list answers as {"answer": ..., "answer_confidence": ...}
        target = [t["answer"] if isinstance(t, dict) and "answer" in t else t for t in target]
    if spec.reference == "data" and target in (None, "", []):
        raise GraftDataError(f"{where}: missing the answer field {spec.answer_field!r}")
    variants = [(None, target)]
    if spec.options_field in record:
        options = _options(record[spec.options_field], where)
        if spec.circular:
            if str(target) not in options:
                raise GraftDataError(f"{where}: answer {target!r} is not an option letter {sorted(options)}")
            variants = [rotate_options(options, str(target), k) for k in range(len(options))]
        else:
            variants = [(options, target)]
    samples = []
    for k, (options, answer) in enumerate(variants):
        fields = dict(record)
        if options is not None:
            fields["options"] = "\n".join(f"{letter}. {text}" for letter, text in options.items())
        text = _format(spec.prompt, fields, where)
        text = with_image_markers(text, len(images))
        if text.count(IMAGE_MARKER) != len(images):
            raise GraftDataError(
                f"{where}: prompt has {text.count(IMAGE_MARKER)} {IMAGE_MARKER} markers for {len(images)} images"
            )
        uid = f"{sid}#r{k}" if len(variants) > 1 else sid
        samples.append(Sample(uid, text, images, answer, options, group=sid, rotation=k, where=where))
    return samples


def load_samples(spec: TaskSpec, data_root=None, limit: int | None = None) -> list[Sample]:
    """Samples of a task in file order; `limit` keeps the first N questions (fine if larger)."""
    root = resolve_data_root(spec, data_root)
    path = root / spec.data
    if not path.is_file():
        raise GraftDataError(f"task {spec.name}: data file {path} does not exist (data root {root})")
    hooks = load_hooks(spec)
    image_root = root / spec.image_root
    samples: list[Sample] = []
    seen: set[str] = set()
    checked: set[Path] = set()
    n_questions = 0
    with path.open(encoding="utf-8-sig") as fh:  # tolerate a byte-order mark
        for lineno, line in enumerate(fh, 1):
            if limit is not None and n_questions >= limit:
                break
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            record = json_loads(line, where, GraftDataError)
            if not isinstance(record, dict):
                raise GraftDataError(f"{where}: each line must be a JSON object")
            if "process_sample" in hooks:
                record = hooks["process_sample"](record)
            built = _build(record, spec, image_root, where, checked)
            if built[0].group in seen:
                raise GraftDataError(f"{where}: duplicate id {built[0].group!r}")
            seen.add(built[0].group)
            samples.extend(built)
            n_questions += 1
    if not samples:
        raise GraftDataError(f"task {spec.name}: {path} holds no samples")
    return samples
