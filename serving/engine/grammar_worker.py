"""Compiling untrusted JSON schemas, regexes and grammars where a crash cannot reach the
engine: static bounds first (grammar_check.py), then a pool of compile worker processes
(grammar_child.py) with a time and a memory limit each, restarted when one dies. Verdicts are
cached by the sha256 of the schema, pattern or grammar, so each compiles (or crashes a worker)
once; the server builds its matchers only from grammars a worker accepted."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from graft.errors import GraftConfigError, RequestError
from graft.serving.engine.grammar_check import (CFG_FIELD, FIELD, REGEX_FIELD,
                                                GrammarLimitError, SchemaLimits, regex_text,
                                                schema_text)

log = logging.getLogger("graft.serving")

# No free whitespace between JSON tokens: with it a small model can pad with spaces or
# newlines until max_tokens and never close the object. The separators are json.dumps'
# defaults, so outputs read like Python's JSON. A schema's "x-guidance" key overrides these.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_CHILD = Path(__file__).with_name("grammar_child.py")
_ROW = re.compile(r"row has (\d+) items; max is (\d+)")


@dataclass(frozen=True)
class CompileLimits:
    schema: SchemaLimits = SchemaLimits()
    timeout_s: float = 10.0  # one schema's compile in a worker; past it the worker is killed
    memory_bytes: int = 2 << 30  # a worker's address space (RLIMIT_AS); 0 = unlimited
    workers: int = 2  # compile processes (a slow schema holds one; others compile beside it)
    cache_entries: int = 1024  # verdicts kept (accepted grammars and refusals)


class _Worker:
    """One compile process and its pipes; used by one thread at a time."""

    def __init__(self, limits: CompileLimits):
        self.proc = subprocess.Popen(
            [sys.executable, str(_CHILD), str(limits.memory_bytes), json.dumps(JSON_OPTIONS)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            start_new_session=True)  # a terminal's Ctrl-C is the server's to handle
        self._buffer = b""
        self.ended = False  # its stdout reached end of file: the process is gone
        if self.read_line(30.0) != {"ready": True}:  # generous: a loaded host starts slowly
            self.kill()
            raise RuntimeError("the grammar compile worker did not start")

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def ask(self, source: str | dict, timeout_s: float) -> dict | None:
        """The child's verdict on a schema's text or {"regex": pattern}; None when it died or
        ran past timeout_s."""
        try:
            self.proc.stdin.write(json.dumps(source).encode() + b"\n")
            self.proc.stdin.flush()
        except OSError:  # died before reading it
            return None
        return self.read_line(timeout_s)

    def read_line(self, timeout_s: float) -> dict | None:
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                self.ended = True
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def kill(self) -> str:
        """Stop the process; how it ended, in words."""
        if not self.ended and self.alive:
            self.proc.kill()
        try:  # one that closed its pipe is exiting: its own status (SIGSEGV) says more
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            pipe.close()
        if code < 0:
            try:
                return f"signal {signal.Signals(-code).name}"
            except ValueError:
                return f"signal {-code}"
        return f"exit status {code}"


class GrammarCompiler:
    """JSON schema -> llguidance grammar, checked by a worker process. Thread-safe: HTTP
    handler threads compile at once, each on a worker of its own."""

    def __init__(self, limits: CompileLimits | None = None):
        self.limits = limits or CompileLimits()
        self._idle: list[_Worker] = []
        self._slots = threading.BoundedSemaphore(self.limits.workers)
        self._lock = threading.Lock()
        # sha256 of the schema text -> (grammar, None, None) or (None, refusal, limit or None)
        self._verdicts: OrderedDict[str, tuple] = OrderedDict()
        self._accepted: OrderedDict[str, None] = OrderedDict()  # sha256 of accepted grammars
        self.hits = self.misses = self.restarts = 0  # counters, for tests and metrics

    def json_grammar(self, schema: dict) -> str:
        """The grammar of `schema`, or GraftConfigError (GrammarLimitError for a limit) whose
        message names SamplingParams.guided_json. Cached by the schema's sha256."""
        text = schema_text(schema, self.limits.schema)
        return self._grammar(_sha(text), text, FIELD)

    def regex_grammar(self, pattern: str, field: str = REGEX_FIELD) -> str:
        """The grammar of a regex the whole output matches; errors name `field`
        (SamplingParams.guided_regex, or the guided_choice it was made from). Cached by the
        pattern's sha256."""
        text = regex_text(pattern, self.limits.schema, field)
        return self._grammar(f"regex:{field}:" + _sha(text), {"regex": text}, field)

    def cfg_grammar(self, text: str, field: str = CFG_FIELD) -> str:
        """The grammar of a context-free grammar's text: Lark (llguidance's syntax) or GBNF
        (llama.cpp's, converted by llguidance); errors name `field`. Cached by its sha256."""
        text = regex_text(text, self.limits.schema, field, "grammar")
        return self._grammar(f"cfg:{field}:" + _sha(text), {"cfg": text}, field)

    def _grammar(self, key: str, source: str | dict, field: str) -> str:
        with self._lock:
            verdict = self._verdicts.get(key)
            if verdict is not None:
                self._verdicts.move_to_end(key)
                self.hits += 1
        if verdict is None:
            verdict = self._compile(source, field)
            with self._lock:
                self.misses += 1
                _remember(self._verdicts, key, verdict, self.limits.cache_entries)
                if verdict[0] is not None:
                    _remember(self._accepted, _sha(verdict[0]), None, self.limits.cache_entries)
        grammar, refusal, limit = verdict
        if refusal is None:
            return grammar
        raise GraftConfigError(refusal) if limit is None else GrammarLimitError(refusal, limit)

    def accepted(self, grammar: str) -> bool:
        """Whether a worker accepted `grammar` (still cached): only those become matchers."""
        key = _sha(grammar)
        with self._lock:
            return key in self._accepted

    def _compile(self, source: str | dict, field: str) -> tuple:
        # a worker that dies on a schema gets one retry on a fresh one: it may have died of
        # something else (killed from outside) just before this schema reached it
        for attempt in (1, 2):
            answer, ended = self._ask(source)
            if answer is not None or attempt == 2:
                break
        what = _KINDS[next(iter(source))] if isinstance(source, dict) else "schema"
        if answer is None:
            log.warning("a %s (%d bytes) is refused: the grammar compile worker %s on it, twice",
                        what, len(json.dumps(source)), ended)
            return (None, f"{field} could not be compiled: the grammar compiler {ended} on it "
                    f"(limits: {self.limits.timeout_s:g} s, {self.limits.memory_bytes >> 20} "
                    f"MiB); send a simpler {what}", "compiler")
        if "grammar" in answer:
            return answer["grammar"], None, None
        return (None, *_refusal(answer, field, what))

    def _ask(self, source: str | dict) -> tuple[dict | None, str]:
        """(the verdict, "") or (None, how the worker ended)."""
        with self._slots:
            worker = self._take()
            answer = worker.ask(source, self.limits.timeout_s)
            if answer is not None:
                with self._lock:
                    self._idle.append(worker)
                return answer, ""
            timed_out = not worker.ended
            how = worker.kill()
            with self._lock:
                self.restarts += 1
            return None, (f"ran past its {self.limits.timeout_s:g} s limit" if timed_out
                          else f"died ({how})")

    def _take(self) -> _Worker:
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.alive:
                    return worker
                worker.kill()  # died while idle (killed from outside): replaced below
                self.restarts += 1
        try:
            return _Worker(self.limits)
        except (OSError, RuntimeError) as err:
            raise RequestError(f"guided decoding is unavailable: {err}; see the server log",
                               param="response_format", code="grammar_compiler_down",
                               reason="unavailable") from None

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.kill()

    def worker_pids(self) -> list[int]:
        """The idle workers' process ids (for tests that kill one)."""
        with self._lock:
            return [w.proc.pid for w in self._idle]


_KINDS = {"regex": "regex", "cfg": "grammar"}  # a worker's source key -> what a client calls it


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _remember(lru: OrderedDict, key: str, value, size: int) -> None:
    lru[key] = value
    lru.move_to_end(key)
    while len(lru) > size:
        lru.popitem(last=False)


def _refusal(answer: dict, field: str, what: str) -> tuple[str, str | None]:
    """(the client's one-line message, the limit it names or None) for a worker's refusal of
    a schema or regex (`what`) sent as SamplingParams `field`."""
    message = " ".join(answer["error"].split())
    limit = row_limit(message)
    if limit is not None:
        return f"{field} {limit}", "max_items_in_row"
    if answer.get("limit") == "memory":
        return (f"{field} could not be compiled within the grammar compiler's memory limit; "
                f"send a simpler {what}", "memory")
    # llguidance appends its parser state and the whole grammar to a matcher's error
    head = message.split(" <state>", 1)[0].strip()
    if head == "NoExtensionBias" and what != "schema":  # the stop reason alone: nothing can
        head = "no text matches it (the grammar has nothing to continue with)"  # come next
    elif head == "NoExtensionBias":
        head = ("no JSON value satisfies it (the grammar has nothing to continue with; a $ref "
                "that leads only back to itself never ends)")
    elif (forced := re.match(r"parser error: Too many items \(limit (\d+); ff_tokens\)", head)):
        # the tokens it forces from the start never run out: nothing it allows can end
        fix = ("take the property that leads back into itself out of \"required\"" if what == "schema"
               else "give the rule that always recurses an alternative that ends")
        head = (f"it forces an output of over {forced.group(1)} tokens from the start, so no "
                f"answer can end (a required part that contains itself); {fix}")
    usable = "JSON schema" if what == "schema" else what
    return f"{field} is not a usable {usable}: {head[:300]}", None


def row_limit(error: str) -> str | None:
    """llguidance's "row has N items; max is M" (ParserTooComplex) as one line naming the
    limit, without the parser state dump that follows it; None for any other error."""
    row = _ROW.search(error)
    if row is None:
        return None
    return (f"is too complex for the grammar engine: a parser row needs {row[1]} items, over "
            f"llguidance's max_items_in_row of {row[2]} (about 500 optional properties in one "
            "object, or a wide anyOf of objects); make properties required or split the object")


_default: GrammarCompiler | None = None
_default_lock = threading.Lock()


def compiler() -> GrammarCompiler:
    """The process's compiler (SamplingParams compiles through it), built on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = GrammarCompiler()
        return _default


def configure(limits: CompileLimits) -> GrammarCompiler:
    """Replace the process's compiler with one under `limits` (its workers are stopped)."""
    global _default
    with _default_lock:
        old, _default = _default, GrammarCompiler(limits)
    if old is not None:
        old.close()
    return _default
