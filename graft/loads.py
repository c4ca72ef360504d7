"""YAML and JSON text to Python values for every file graft reads (specs, serve configs,
quantization configs, traces, eval tasks): each way a file can fail to parse is one GraftError
naming where and the fix, never a traceback from inside the parser.

Besides syntax errors, both parsers raise a plain ValueError for an integer past Python's
4300-digit limit on int(str) (and YAML for a date like 2024-13-01), and RecursionError for
nesting deeper than the interpreter's stack; those are caught here too.
"""

from __future__ import annotations

import json
import re
import sys

from graft.errors import GraftConfigError


def yaml_loads(text: str, where: str, error: type = GraftConfigError):
    """`yaml.safe_load(text)`; `error("{where} line L, column C: ...")` when it cannot."""
    import yaml

    try:
        return yaml.load(text, Loader=_loader())  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        at = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = " ".join(str(err.problem or err.context or "").split())
        what = "cannot read a value" if isinstance(err, yaml.constructor.ConstructorError) \
            else "not valid YAML"
        raise error(f"{where}{at}: {what} ({problem})") from None
    except yaml.YAMLError as err:
        raise error(f"{where}: not valid YAML ({' '.join(str(err).split())})") from None
    except RecursionError:
        raise error(f"{where}: nested too deeply to read; flatten it") from None


def json_loads(text: str, where: str, error: type = GraftConfigError):
    """`json.loads(text)`; `error("{where}: ...")` naming the column (and line, for a text of
    several lines) when it cannot."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        at = f"line {err.lineno}, column {err.colno}" if "\n" in text.strip() else \
            f"column {err.colno}"
        raise error(f"{where}: not valid JSON ({err.msg} at {at})") from None
    except ValueError as err:  # json reads ints with int(): the digit limit
        raise error(f"{where}: {_long_int_text(text, err)}") from None
    except RecursionError:
        raise error(f"{where}: nested too deeply to read; flatten it") from None


def _long_int_text(text: str, err: ValueError) -> str:
    """What to say about a ValueError from int(str) inside a parser: where in `text` the
    over-long number is and what to do about it."""
    limit = sys.get_int_max_str_digits()
    found = re.search(r"\d{%d,}" % (limit + 1), text) if limit else None
    if "integer string conversion" not in str(err) or found is None:
        return f"{err}; quote the value if it is text"
    line = text.count("\n", 0, found.start()) + 1
    column = found.start() - (text.rfind("\n", 0, found.start()) + 1) + 1
    at = f"line {line}, column {column}" if "\n" in text.strip() else f"column {column}"
    return (f"the number at {at} has {len(found.group())} digits, over Python's limit of "
            f"{limit} for an integer; use a smaller number (or quote it, if it is text)")


_LOADER = None


def _loader():
    """yaml.SafeLoader whose value errors (an over-long int, a date like 2024-13-01) carry the
    line of the value, as syntax errors do."""
    global _LOADER
    if _LOADER is None:
        import yaml

        class Loader(yaml.SafeLoader):
            def construct_object(self, node, deep=False):
                try:
                    return super().construct_object(node, deep)
                except ValueError as err:
                    # the mark says where: the scalar's own text needs no position
                    problem = _long_int_text(str(node.value), err).replace(
                        "the number at column 1 ", "the number ")
                    raise yaml.constructor.ConstructorError(
                        None, None, problem, node.start_mark) from None

        _LOADER = Loader
    return _LOADER
