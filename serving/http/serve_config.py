"""`graft serve --config serve.yaml`: every serve option from a YAML file (keys are the flags'
names, `max_num_seqs` or `max-num-seqs`); flags given on the command line win over the file. A
flag that takes JSON (--kv-transfer-config, --kv-events-config) takes a YAML mapping too."""

from __future__ import annotations

import argparse
import difflib
import json
from pathlib import Path

from graft.errors import GraftConfigError

_NOT_KEYS = ("help", "config")


def parse_args(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse `argv`; with --config, parse again over the file's values as defaults, so what the
    command line gives still wins."""
    args = parser.parse_intermixed_args(argv)
    if getattr(args, "config", None):
        parser.set_defaults(**load_serve_config(args.config, parser))
        args = parser.parse_intermixed_args(argv)
    return args


def load_serve_config(path: str | Path, parser: argparse.ArgumentParser) -> dict:
    """{dest: value} from the YAML file, each value checked as its flag would check it."""
    from graft.loads import yaml_loads

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise GraftConfigError(f"--config {path}: cannot read it ({err.strerror})") from None
    except UnicodeDecodeError:
        raise GraftConfigError(f"--config {path}: not UTF-8 text; save it as UTF-8") from None
    data = yaml_loads(text, f"--config {path}") or {}
    if not isinstance(data, dict):
        raise GraftConfigError(f"--config {path}: the file must be a mapping of option: value")
    actions = {a.dest: a for a in parser._actions if a.dest not in _NOT_KEYS}
    values = {}
    for key, value in data.items():
        dest = str(key).replace("-", "_")
        if dest not in actions:
            close = difflib.get_close_matches(dest, list(actions), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else "; see graft serve --help"
            raise GraftConfigError(f"{path}: unknown key {key!r} (not a graft serve option){hint}")
        values[dest] = _checked(actions[dest], value, f"{path}: {key}")
    return values


def _checked(action: argparse.Action, value, where: str):
    if action.nargs == 0:  # a switch: the file says the resulting value (true / false)
        if not isinstance(value, bool):
            raise GraftConfigError(f"{where}: must be true or false, got {value!r}")
        return value
    if value is None:
        return None
    if action.nargs in ("+", "*") or isinstance(action, argparse._AppendAction):
        items = value if isinstance(value, list) else [value]
        return [_one(action, item, where) for item in items]
    if isinstance(value, dict) and action.metavar == "JSON":
        # a flag that takes JSON text (--kv-transfer-config): the file may write it as YAML
        value = json.dumps(value)
    elif isinstance(value, (list, dict)) and action.dest != "quantization":
        raise GraftConfigError(f"{where}: must be a single value, got {value!r}")
    return _one(action, value, where)


def _one(action: argparse.Action, value, where: str):
    if isinstance(value, dict):  # quantization: the quant.json content inline
        return value
    if action.type is None and not isinstance(value, str):
        # a text option (api_key, host, ...): YAML turned the unquoted text into another type,
        # and str() of it need not be what was written (0123 is read as the octal 83)
        raise GraftConfigError(f"{where}: must be text, but YAML read the unquoted value as "
                               f"{type(value).__name__} {value!r}; put the value in quotes, as "
                               "written (e.g. \"0123\")")
    if action.type is not None:
        try:
            value = action.type(str(value))
        except (argparse.ArgumentTypeError, ValueError) as err:
            raise GraftConfigError(f"{where}: {err}") from None
    if action.choices is not None and value not in action.choices:
        raise GraftConfigError(f"{where}: must be one of {', '.join(map(str, action.choices))}, "
                               f"got {value!r}")
    return value
