"""Which GraftSpec fields are input paths, where relative ones point, and whether they exist.

A relative input path in a YAML file is relative to that file's folder (so a config and its
data can move together); one given with `--set` is relative to the current directory.
Outputs (output_dir, train.feature_cache) stay relative to the current directory.
"""

from __future__ import annotations

import os
from pathlib import Path

from graft.errors import GraftConfigError

# dotted field -> what must be there ("dir", "file" or "any": a dir or a weights file)
INPUT_PATHS = {
    "llm.path": "dir",
    "encoder.path": "any",
    "data.train": "file",
    "data.val": "file",
    "data.image_root": "dir",
    "adapter_init": "dir",
}


def absolutize(value, base: Path):
    """`value` joined onto `base` when it is a relative path; `~` and `${ENV}` paths are kept
    as written (they are expanded at use and are absolute once expanded)."""
    if not isinstance(value, str) or not value:
        return value
    if os.path.isabs(os.path.expandvars(os.path.expanduser(value))):
        return value
    return os.path.normpath(str(base / value))


def resolve_file_paths(raw: dict, base: Path) -> None:
    """Make the raw mapping's relative input paths absolute against `base` (in place)."""
    for dotted in INPUT_PATHS:
        *parents, leaf = dotted.split(".")
        node = raw
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and leaf in node:
            node[leaf] = absolutize(node[leaf], base)


def check_paths(spec) -> None:
    """GraftConfigError naming the first input path that is missing or of the wrong kind."""
    for dotted, kind in INPUT_PATHS.items():
        *parents, leaf = dotted.split(".")
        node = spec
        for part in parents:
            node = getattr(node, part)
        value = node.get(leaf) if isinstance(node, dict) else getattr(node, leaf)
        if not value:
            continue
        path = Path(os.path.expandvars(os.path.expanduser(value)))
        if not path.exists():
            raise GraftConfigError(f"{dotted}: {path} does not exist (relative paths in a YAML "
                                   "file are relative to its folder; --set paths to the "
                                   "current directory)")
        if kind == "dir" and not path.is_dir() or kind == "file" and not path.is_file():
            raise GraftConfigError(f"{dotted}: {path} is not a {'folder' if kind == 'dir' else 'file'}")
        if not os.access(path, os.R_OK):
            raise GraftConfigError(f"{dotted}: {path} is not readable")
    llm = Path(os.path.expandvars(os.path.expanduser(spec.llm.path)))
    if not (llm / "config.json").is_file():
        raise GraftConfigError(f"llm.path: {llm} has no config.json; point it at a local HF "
                               "model directory (config.json + *.safetensors)")
