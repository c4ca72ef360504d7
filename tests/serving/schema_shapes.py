"""JSON schemas that used to hurt the server (issue #46): a $ref chain deep enough to overflow
llguidance's stack, objects too wide for its parser rows, and one whose wide object only
shows after a 70-character string (past the compile-time walk)."""


def ref_chain(n: int) -> dict:
    """$defs d0 -> d1 -> ... -> dn (a string): 3000 links segfault llguidance's compiler."""
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
    defs[f"d{n}"] = {"type": "string"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def wide_object(n: int) -> dict:
    """n optional string properties: 500 make a parser row of 2007 items (llguidance: 2000)."""
    return {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(n)}}


# {"z": <exactly 70 characters>, "a": <500 optional properties>}: the row limit is met only
# when generation reaches "a"
LATE_WIDE = {"type": "object", "additionalProperties": False, "required": ["z", "a"],
             "properties": {"z": {"type": "string", "minLength": 70, "maxLength": 70},
                            "a": wide_object(500)}}
