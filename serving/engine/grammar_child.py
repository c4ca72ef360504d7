"""The grammar compile worker's process (run as a script by grammar_worker.py, never imported
by the server): reads one JSON schema (a JSON string), {"regex": pattern} or {"cfg": Lark or
GBNF text} per line on stdin, compiles it with llguidance, walks its first bytes, and writes
one verdict per line on stdout. A schema or grammar that crashes llguidance (a stack overflow
on a deep $ref chain, a deep rule chain) ends this process, never the server.

Imports the standard library and llguidance only: no torch, no transformers, fast to start."""

from __future__ import annotations

import json
import os
import resource
import sys

# the bytes the walk takes first where the grammar allows them: between values, open the next
# object or array; inside a string, close it. So it reaches nested values (where an over-wide
# parser row shows) in few steps
_OUTSIDE, _INSIDE = b'{["', b'"'
_WALK_STEPS = 64  # bytes walked from the start; a row too wide past them shows mid-generation
_EOS = 256  # the byte tokenizer: token b is byte b, 256 is the end


class _ByteTokenizer:
    """One token per byte: the walk follows the grammar, not any model's vocabulary."""

    eos_token_id = _EOS
    bos_token_id = None
    tokens = [bytes([b]) for b in range(256)] + [b"<eos>"]
    special_token_ids = [_EOS]

    def __call__(self, text: bytes) -> list[int]:
        return list(text)


def _limit_memory(max_bytes: int) -> None:
    if max_bytes > 0:  # address space: an allocation past it fails here, not in the server
        resource.setrlimit(resource.RLIMIT_AS, (max_bytes, max_bytes))


def verdict(source: str | dict, options: dict, lltok) -> dict:
    """{"grammar": str} when the JSON schema text (or {"regex": ...}, {"cfg": ...}) compiles and
    its first bytes can be matched, else {"error": one line, "limit": llguidance's stop reason
    or None}."""
    from llguidance import LLMatcher, grammar_from

    try:
        if isinstance(source, dict) and "cfg" in source:  # Lark, or GBNF converted to Lark
            grammar = grammar_from("grammar", source["cfg"])
        elif isinstance(source, dict):
            grammar = LLMatcher.grammar_from_regex(source["regex"])
        else:
            grammar = LLMatcher.grammar_from_json_schema(source, defaults=options)
    except Exception as err:  # noqa: BLE001 - whatever llguidance cannot read is a bad schema
        return {"error": str(err), "limit": None}
    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        return {"error": messages[0], "limit": None}
    matcher = LLMatcher(lltok, grammar, log_level=0)
    in_string, escaped = False, False
    for _ in range(_WALK_STEPS):
        if matcher.is_error() or matcher.is_stopped():
            break
        allowed = _allowed(matcher.compute_bitmask())
        if matcher.is_error() or not allowed:
            break
        preferred = _INSIDE if in_string else _OUTSIDE
        pick = next((b for b in preferred if b in allowed), min(allowed))
        matcher.consume_token(pick)
        if pick == ord('"') and not escaped:
            in_string = not in_string
        escaped = in_string and pick == ord("\\") and not escaped
    if matcher.is_error():
        reason = matcher.stop_reason()
        return {"error": matcher.get_error(), "limit": None if reason == "NotStopped" else reason}
    return {"grammar": grammar}


def _allowed(mask: bytes) -> set[int]:
    """The byte tokens (not the end) a packed bitmask allows."""
    return {b for b in range(256) if mask[b >> 3] >> (b & 7) & 1}


def main() -> None:
    from llguidance import LLTokenizer, TokenizerWrapper

    _limit_memory(int(sys.argv[1]))
    os.nice(10)  # on a busy host the engine's thread gets the cores first
    options = json.loads(sys.argv[2])
    lltok = LLTokenizer(TokenizerWrapper(_ByteTokenizer()))
    out = sys.stdout.buffer
    out.write(b'{"ready": true}\n')
    out.flush()
    for line in sys.stdin.buffer:
        try:
            answer = verdict(json.loads(line), options, lltok)
        except MemoryError:
            answer = {"error": "out of memory", "limit": "memory"}
        out.write(json.dumps(answer).encode() + b"\n")
        out.flush()


if __name__ == "__main__":
    main()
