"""Where a sampled stack's time goes, for `graft bench profile`: py-spy's raw samples
("process N:"cmd";thread (tid): name;outer (file.py:12);...;inner (file.py:34) COUNT") sorted
into categories by one rule table per engine.

A sample goes to the first category whose rule matches a frame, frames tried from the innermost
outwards: in a rule pass over that engine's table, then, if nothing matched, over GENERIC (the
frameworks every frame sits on: asyncio, uvicorn, torch), so an inner asyncio call made for the
engine's hand-off is not charged to HTTP. Time inside C (oneDNN, graft's kernels, tokenizers)
has no frame of its own: it lands on the Python frame that made the call.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

CATEGORIES = ("linears", "attention", "fused C decode step", "norms, rope, activations",
              "model forward, other", "sampling", "scheduling and batch prep",
              "tokenize / detokenize", "IPC and hand-off", "spin waits", "HTTP and API server",
              "blocking waits", "other Python")
OTHER = "other Python"
# inductor's generated code (vLLM compiles its model): the frame's source line says which op
COMPILED = "compiled"

# (category, file pattern, function pattern or None); a file pattern matches at a path
# component, so "serving/http/" is also ".../main/serving/http/x.py"
_SHARED = [
    ("tokenize / detokenize", r"transformers/tokenization|transformers/utils/chat_template"
                              r"|tokenizers/|jinja2/", None),
    ("IPC and hand-off", r"zmq/|msgspec/|msgpack/", None),
]
RULES: dict[str, list[tuple[str, str, str | None]]] = {
    "graft": _SHARED + [
        # linears and attention of a decode step run inside one C call there
        ("fused C decode step", r"serving/models/fused_decode\.py|kernels/cpu_decode\.py", None),
        ("linears", r"kernels/(cpu_linear|cpu_quant|quant_formats|linear_dispatch)\.py"
                    r"|torch/nn/modules/linear\.py", None),
        ("linears", r"kernels/", r"linear|gemm"),  # dispatch.quant_linear, moe_grouped_gemm
        ("linears", r"serving/models/layers\.py", r"^(Packed)?Linear\."),
        ("attention", r"kernels/paged_attention\.py", None),
        ("attention", r"kernels/", r"attention|store_kv|_store_i8"),
        ("attention", r"serving/models/layers\.py", r"paged_attention|^Attention\."),
        ("norms, rope, activations", r"kernels/norm_rope\.py|transformers/activations\.py", None),
        ("norms, rope, activations", r"kernels/", r"norm|rotary|rope|silu|gelu"),
        ("norms, rope, activations", r"serving/models/layers\.py", r"RMSNorm|activate"),
        ("sampling", r"serving/engine/(sampler|logits_processors|guided|grammar_\w+)\.py", None),
        ("sampling", r"kernels/", r"argmax"),
        ("model forward, other", r"serving/models/|torch/nn/modules/", None),
        ("tokenize / detokenize", r"graft/template\.py|serving/engine/tokenizer\.py", None),
        ("tokenize / detokenize", r"serving/engine/outputs\.py", r"Detokenizer"),
        # the engine thread handing tokens to the event loop: graft's IPC
        ("IPC and hand-off", r"serving/http/engine_worker\.py", r"_deliver"),
        ("IPC and hand-off", r"serving/http/openai/responses\.py", r"sink"),
        ("scheduling and batch prep", r"serving/engine/|serving/http/engine_worker\.py", None),
        ("HTTP and API server", r"serving/http/", None),
    ],
    "vllm": _SHARED + [
        # a process polling shared memory for the other's message, sched_yield between polls:
        # it holds a core while the worker computes (vLLM's engine core <-> worker queue)
        ("spin waits", r"vllm/distributed/device_communicators/shm_broadcast\.py", None),
        ("spin waits", r"vllm/distributed/utils\.py", r"sched_yield"),
        # py-spy names a file outside sys.path by its base name: inductor's are c + 51 characters
        (COMPILED, r"torchinductor_[^/]+/|inductor_cache/|^c[a-z0-9]{51}\.py$", None),
        ("linears", r"vllm/model_executor/layers/linear\.py|torch/nn/modules/linear\.py", None),
        ("linears", r"vllm/model_executor/layers/utils\.py", r"gemm|<lambda>"),
        ("linears", r"vllm/model_executor/layers/vocab_parallel_embedding\.py", r"apply"),
        ("attention", r"vllm/v1/attention/|vllm/model_executor/layers/attention/", None),
        ("attention", r"vllm/_custom_ops\.py", r"attn|attention|cache"),
        ("linears", r"vllm/_custom_ops\.py", r"mm|gemm|linear"),
        ("norms, rope, activations", r"vllm/model_executor/layers/(layernorm|activation)\.py"
                                     r"|vllm/model_executor/layers/rotary_embedding/", None),
        ("norms, rope, activations", r"vllm/_custom_ops\.py", r"norm|rotary|silu|gelu"),
        ("sampling", r"vllm/v1/sample/|vllm/v1/structured_output/"
                     r"|vllm/model_executor/layers/logits_processor\.py", None),
        ("model forward, other", r"vllm/model_executor/|vllm/compilation/|vllm/forward_context\.py"
                                 r"|torch/_dynamo/|torch/_inductor/|torch/fx/|torch/nn/modules/", None),
        ("tokenize / detokenize", r"vllm/v1/engine/detokenizer\.py|vllm/tokenizers/|vllm/renderers/"
                                  r"|vllm/transformers_utils/|vllm/entrypoints/chat_utils\.py", None),
        ("IPC and hand-off", r"vllm/v1/serial_utils\.py|vllm/v1/engine/(core_client|tensor_ipc)\.py",
         None),
        ("IPC and hand-off", r"vllm/v1/engine/core\.py", r"socket|_send|_recv"),
        ("scheduling and batch prep", r"vllm/v1/core/|vllm/v1/worker/|vllm/v1/executor/"
                                      r"|vllm/v1/engine/(core|output_processor)\.py"
                                      r"|vllm/v1/(request|outputs)\.py", None),
        ("HTTP and API server", r"vllm/entrypoints/|vllm/v1/engine/|vllm/v1/metrics/", None),
    ],
}
# a stack whose innermost frame is one of these was caught runnable inside a blocking wait
# (woken, or waiting for a core), not computing: kept apart, it would swell HTTP (the event
# loop's selector) or scheduling (the engine thread's condition)
WAITS = [(r"threading\.py", r"(^|\.)(wait|acquire)$"), (r"selectors\.py", r"(^|\.)select$"),
         (r"queue\.py", r"(^|\.)get$"), (r"concurrent/futures/thread\.py", r"^_worker$"),
         (r"zmq/", r"(^|\.)poll$"), (r"multiprocessing/connection\.py", r"(^|\.)(wait|poll)$")]
GENERIC = [
    ("HTTP and API server", r"uvicorn/|starlette/|fastapi/|h11/|httptools/|anyio/|asyncio/"
                            r"|pydantic/|pydantic_core/|sse_starlette/|httpx/", None),
    ("model forward, other", r"torch/", None),
]
# a line of inductor's generated `call`: fused pointwise kernels (norms, rope, SiLU-and-mul,
# residual adds: their names list the ops, a following mm's input prep included) come first
COMPILED_LINES = [
    ("norms, rope, activations", r"\bcpp_fused_\w*\("),
    ("attention", r"attention|kv_cache|reshape_and_cache"),
    ("linears", r"onednn_mm|\bmm\b|addmm|weight_packed|gemm|linear"),
]
_FRAME = re.compile(r"^(.*) \(([^()]*?)(?::(\d+))?\)$")


@dataclass(frozen=True)
class Sample:
    processes: tuple[str, ...]  # command lines, the server's first
    thread: str  # its name, "?" without --threads
    frames: tuple[tuple[str, str, int], ...]  # (function, file, line), outermost first
    count: int


def parse(text: str) -> list[Sample]:
    """py-spy's raw format; a record spans lines where a command line held a newline (it ends
    at a line ending in its count whose process frames are all closed)."""
    out, buf = [], []
    for line in text.splitlines():
        buf.append(line)
        record = _record("\n".join(buf)) if re.search(r" \d+$", line) else None
        if record is not None:
            out.append(record)
            buf = []
    return out


def _record(text: str) -> Sample | None:
    body, count = text.rsplit(" ", 1)
    processes = []
    while body.startswith("process "):  # a child's frame follows its parent's
        m = re.match(r'process \d+:"(.*?)"(;|$)', body, re.S)
        if m is None:  # a command line cut by a newline: the record goes on
            return None
        processes.append(m.group(1))
        body = body[m.end():]
    thread = "?"
    m = re.match(r"thread \(\w+\)(?:: ([^;]*))?(;|$)", body)
    if m:
        thread = m.group(1) or "?"
        body = body[m.end():]
    frames = []
    for part in body.split(";") if body else ():  # none: the thread ran outside Python
        f = _FRAME.match(part)
        frames.append((f.group(1), f.group(2), int(f.group(3) or 0)) if f else (part, "", 0))
    return Sample(tuple(processes), thread, tuple(frames), int(count))


def _compile(rules) -> list[tuple[str, re.Pattern, re.Pattern | None]]:
    return [(cat, re.compile(rf"(?:^|/)(?:{where})"), re.compile(func) if func else None)
            for cat, where, func in rules]


_TABLES = {name: _compile(rules) for name, rules in RULES.items()}
_GENERIC = _compile(GENERIC)
_WAITS = _compile(("blocking waits", where, fn) for where, fn in WAITS)


def classify(frames, engine: str) -> str:
    """The category of a stack (frames outermost first, as parsed)."""
    if frames and any(where.search(frames[-1][1]) and fn.search(frames[-1][0])
                      for _, where, fn in _WAITS):
        return "blocking waits"
    for table in (_TABLES[engine], _GENERIC):
        for func, path, line in reversed(frames):
            for cat, where, fn in table:
                if where.search(path) and (fn is None or fn.search(func)):
                    return compiled_line(path, line) if cat == COMPILED else cat
    return OTHER


# where inductor writes its output code when the frame gives only the file's base name
COMPILED_DIRS = ("~/.cache/vllm/torch_compile_cache/*/*/inductor_cache/*", "/tmp/torchinductor_*/*")


def compiled_line(path: str, line: int) -> str:
    """The category of line `line` of an inductor output file (read where the server wrote
    it; gone or unreadable: the compiled graph's own overhead)."""
    try:
        text = _compiled_source(path)[line - 1]
    except (OSError, IndexError):
        return "model forward, other"
    for cat, pattern in COMPILED_LINES:
        if re.search(pattern, text):
            return cat
    return "model forward, other"


@functools.lru_cache(maxsize=64)
def _compiled_source(path: str) -> list[str]:
    found = Path(path)
    if not found.is_absolute():
        hits = [p for pattern in COMPILED_DIRS
                for p in Path("/").glob(str(Path(pattern).expanduser()).lstrip("/") + "/" + path)]
        if not hits:
            raise OSError(f"{path}: not found")
        found = hits[0]
    return found.read_text(errors="replace").splitlines()


def process_label(processes: tuple[str, ...]) -> str:
    """The server's own process is "main"; a child is its title (vLLM names its engine core
    process VLLM::EngineCore) or the start of its command line."""
    if len(processes) <= 1:
        return "main"
    cmd = processes[-1].split("\n")[0]
    return cmd if len(cmd) <= 48 else cmd[:47] + "…"


@dataclass
class Tally:
    categories: Counter = field(default_factory=Counter)
    processes: dict = field(default_factory=dict)  # label -> Counter of categories
    threads: Counter = field(default_factory=Counter)  # "process / thread" -> samples
    frames: dict = field(default_factory=dict)  # category -> Counter of innermost frames


def tally(samples: list[Sample], engine: str) -> Tally:
    t = Tally()
    for s in samples:
        cat = classify(s.frames, engine)
        proc = process_label(s.processes)
        t.categories[cat] += s.count
        t.processes.setdefault(proc, Counter())[cat] += s.count
        # asyncio_0, asyncio_1, ...: one pool, one row
        t.threads[f"{proc} / {re.sub(r'[_-]?[0-9]+$', '', s.thread) or s.thread}"] += s.count
        if s.frames:
            func, path, _ = s.frames[-1]
            t.frames.setdefault(cat, Counter())[f"{func} ({path})"] += s.count
    return t
