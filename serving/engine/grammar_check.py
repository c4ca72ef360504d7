"""Static bounds on a JSON schema before llguidance sees it: its size in bytes, its number of
objects, and its depth counting every $ref followed (llguidance recurses once per level and
overflows its stack on a $ref chain a few thousand long). Pure Python, no llguidance."""

from __future__ import annotations

import json
from dataclasses import dataclass

from graft.errors import GraftConfigError


class GrammarLimitError(GraftConfigError):
    """A schema over one of the grammar limits; `limit` names it (the HTTP layer answers 400
    code schema_too_complex)."""

    def __init__(self, message: str, limit: str):
        super().__init__(message)
        self.limit = limit


@dataclass(frozen=True)
class SchemaLimits:
    max_bytes: int = 128 << 10  # the schema as compact JSON
    max_nodes: int = 4096  # JSON objects in the schema (each property's schema is one)
    # objects on the longest path, a $ref counting as a step into its target; llguidance's
    # stack overflows near 930 levels of property-through-$ref (2500 of bare $refs)
    max_depth: int = 128


FIELD = "SamplingParams.guided_json"
REGEX_FIELD = "SamplingParams.guided_regex"
CFG_FIELD = "SamplingParams.guided_cfg"


def schema_text(schema: dict, limits: SchemaLimits) -> str:
    """The schema as compact JSON (property order kept: it is the output's order), or
    GrammarLimitError naming the limit it is over."""
    text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    size = len(text.encode())
    if size > limits.max_bytes:
        raise GrammarLimitError(f"{FIELD} is {size} bytes of JSON schema, over the limit of "
                                f"{limits.max_bytes}; send a smaller schema", "max_bytes")
    nodes = _count_objects(schema)
    if nodes > limits.max_nodes:
        raise GrammarLimitError(f"{FIELD} has {nodes} JSON objects (subschemas), over the limit "
                                f"of {limits.max_nodes}; send a smaller schema", "max_nodes")
    depth = ref_depth(schema)
    if depth > limits.max_depth:
        raise GrammarLimitError(f"{FIELD} nests {depth} levels deep (each $ref followed counts "
                                f"as a level), over the limit of {limits.max_depth}; flatten "
                                "its $ref chains", "max_depth")
    return text


def regex_text(pattern: str, limits: SchemaLimits, field: str = REGEX_FIELD,
               kind: str = "regex") -> str:
    """The pattern (or a grammar's text, `kind` "grammar"), or GrammarLimitError naming `field`
    when it is over the size bound schemas have."""
    size = len(pattern.encode())
    if size > limits.max_bytes:
        raise GrammarLimitError(f"{field} is {size} bytes as a {kind}, over the limit of "
                                f"{limits.max_bytes}; send a shorter one", "max_bytes")
    return pattern


def _count_objects(value) -> int:
    count, todo = 0, [value]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            count += 1
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return count


def ref_depth(schema: dict) -> int:
    """Objects on the longest path from the root, where a local "$ref" ("#/...") leads to its
    target as well. A $ref back into the path (a recursive schema: a tree, a list) is a
    grammar rule llguidance reuses, not more depth, so it is not followed; a $ref that does
    not resolve is left to llguidance to report. Iterative: a chain may be thousands long."""
    depth: dict[int, int] = {}  # id(object) -> longest path below it, itself included
    on_path: set[int] = set()
    stack = [(schema, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        children = [c for c in _children(node, schema) if isinstance(c, dict)]
        if done:
            on_path.discard(key)
            depth[key] = 1 + max((depth.get(id(c), 0) for c in children
                                  if id(c) not in on_path), default=0)
            continue
        if key in depth or key in on_path:
            continue
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in depth and id(c) not in on_path)
    return depth[id(schema)]


def _children(node: dict, root: dict) -> list:
    """The objects directly inside `node` (through lists too) and the target of its $ref."""
    out, todo = [], list(node.values())
    while todo:
        value = todo.pop()
        if isinstance(value, dict):
            out.append(value)
        elif isinstance(value, list):
            todo.extend(value)
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        target = _resolve(root, ref[1:])
        if isinstance(target, dict):
            out.append(target)
    return out


def _resolve(root, pointer: str):
    """The value at a JSON pointer ("/$defs/a"), or None."""
    node = root
    for part in pointer.split("/")[1:] if pointer else ():
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node
