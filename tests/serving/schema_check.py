"""A small JSON Schema checker for the keywords the guided-decoding tests use (jsonschema is
not a dependency): type, properties, required, additionalProperties, items, enum, const,
anyOf, minimum/maximum, minLength/maxLength, minItems/maxItems."""

TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def problems(value, schema: dict, path: str = "$") -> list[str]:
    """Where `value` breaks `schema` (empty: it validates)."""
    out = []
    if "anyOf" in schema:
        if all(problems(value, s, path) for s in schema["anyOf"]):
            out.append(f"{path}: matches no anyOf branch")
    if "const" in schema and value != schema["const"]:
        out.append(f"{path}: {value!r} != const {schema['const']!r}")
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{path}: {value!r} not in {schema['enum']}")
    kind = schema.get("type")
    if kind is not None and not _is_type(value, kind):
        return out + [f"{path}: {value!r} is not {kind}"]
    if isinstance(value, dict):
        props = schema.get("properties", {})
        out += [f"{path}: missing {k!r}" for k in schema.get("required", []) if k not in value]
        for key, item in value.items():
            if key in props:
                out += problems(item, props[key], f"{path}.{key}")
            elif schema.get("additionalProperties") is False:
                out.append(f"{path}: unexpected key {key!r}")
    if isinstance(value, list):
        out += _bounds(len(value), schema, "minItems", "maxItems", path)
        for i, item in enumerate(value):
            out += problems(item, schema.get("items", {}), f"{path}[{i}]")
    if isinstance(value, str):
        out += _bounds(len(value), schema, "minLength", "maxLength", path)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        out += _bounds(value, schema, "minimum", "maximum", path)
    return out


def _is_type(value, kind) -> bool:
    if isinstance(kind, list):
        return any(_is_type(value, k) for k in kind)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, TYPES[kind])


def _bounds(n, schema, low, high, path) -> list[str]:
    out = []
    if low in schema and n < schema[low]:
        out.append(f"{path}: {n} < {low} {schema[low]}")
    if high in schema and n > schema[high]:
        out.append(f"{path}: {n} > {high} {schema[high]}")
    return out


# the schemas the tests decode against: bounded, so even a random model closes them
ANSWER = {"type": "object", "properties": {
    "answer": {"enum": ["yes", "no"]},
    "count": {"type": "integer", "minimum": 0, "maximum": 9},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 2}},
    "required": ["answer", "count", "tags"], "additionalProperties": False}
# what a forced tool call looks like (anyOf over functions, const names, nested arguments)
TOOL_CALL = {"anyOf": [
    {"type": "object", "properties": {
        "name": {"const": "get_weather"},
        "arguments": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 8}, "celsius": {"type": "boolean"}},
            "required": ["city", "celsius"], "additionalProperties": False}},
     "required": ["name", "arguments"], "additionalProperties": False},
    {"type": "object", "properties": {
        "name": {"const": "add"},
        "arguments": {"type": "object", "properties": {
            "xs": {"type": "array", "items": {"type": "integer", "minimum": -9, "maximum": 9},
                   "minItems": 1, "maxItems": 3}},
            "required": ["xs"], "additionalProperties": False}},
     "required": ["name", "arguments"], "additionalProperties": False}]}
