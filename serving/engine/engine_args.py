"""Command-line flags derived from EngineConfig's fields: every command that builds an engine
(serve, chat, eval, bench, quantize) declares its engine flags through `add_engine_args`, so an
option added to EngineConfig appears in all of them, with the same help, default and choices."""

from __future__ import annotations

import argparse
import dataclasses
import typing

from graft.cli_types import number_in
from graft.serving.engine.config import DECLARED, EngineConfig, engine_values


def engine_fields(config_cls=None) -> list[dataclasses.Field]:
    """The options: every init field (a subclass's new fields included)."""
    return [f for f in dataclasses.fields(config_cls or EngineConfig) if f.init]


def flag_of(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def add_engine_args(parser: argparse.ArgumentParser, exclude=(), defaults: dict | None = None,
                    unset: bool = False, config_cls=None) -> None:
    """One flag per EngineConfig option, in an "engine options" group. `exclude`: options the
    command fixes itself (or gives another meaning); `defaults`: the command's own defaults;
    `unset`: every flag defaults to None (not given), so the command can tell what was asked."""
    unknown = (set(exclude) | set(defaults or {})) - {f.name for f in engine_fields(config_cls)}
    if unknown:  # a typo here would silently leave a flag in place
        raise ValueError(f"add_engine_args: no engine option named {sorted(unknown)}")
    group = parser.add_argument_group("engine options (the fields of EngineConfig)")
    hints = typing.get_type_hints(config_cls or EngineConfig)
    declared = []
    for f in engine_fields(config_cls):
        if f.name in exclude:
            continue
        default = (defaults or {}).get(f.name, f.default)
        kwargs = _argparse_kwargs(f, hints[f.name], default, unset)
        group.add_argument(flag_of(f), dest=f.name, **kwargs)
        declared.append(f.name)
    parser.set_defaults(**{DECLARED: tuple(declared)})


def _argparse_kwargs(f: dataclasses.Field, hint, default, unset: bool) -> dict:
    help_text = f.metadata.get("help", "")
    if hint is bool:  # a switch that flips the default (--enforce-eager, --no-prefix-caching)
        return {"action": "store_const", "const": not f.default,
                "default": None if unset else default, "help": help_text}
    kind = next((t for t in (int, float) if t is hint or t in typing.get_args(hint)), None)
    value_type = f.metadata.get("parse", str) if kind is None else number_in(
        kind, low=f.metadata.get("min", 1 if kind is int else None), high=f.metadata.get("max"),
        low_open=f.metadata.get("min_open", False))
    if default is not None:  # unset: argparse's default is None, so the value is written out
        help_text += f" (default: {default})".replace("%", "%%") if unset \
            else " (default: %(default)s)"
    return {"type": value_type, "default": None if unset else default,
            "choices": f.metadata.get("choices"),
            "metavar": f.metadata.get("metavar"), "help": help_text}


def given_options(args: argparse.Namespace) -> list[str]:
    """With `unset=True`: the engine options the user gave."""
    return list(engine_values(args))


def changed_flags(args: argparse.Namespace, ignore=()) -> list[str]:
    """The flags of the engine options whose parsed value is not EngineConfig's default
    (`ignore`: options that mean something without an engine too, e.g. device)."""
    values = engine_values(args)
    return [flag_of(f) for f in engine_fields()
            if f.name in values and f.name not in ignore and values[f.name] != f.default]
