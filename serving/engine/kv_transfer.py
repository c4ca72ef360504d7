"""Prefill/decode split at the engine: a finished prompt's KV blocks held for another engine
to read (exports), and KV read from another engine written into fresh blocks of this pool
(imports). How the bytes travel is not the engine's business: serving/http/fleet/pd.py moves
them; here they are tensors of one layout, token-major so that the two pools' block sizes
need not agree.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from graft.serving.engine.sequence import Sequence

log = logging.getLogger("graft.serving")

DEFAULT_EXPORT_TTL_S = 60.0  # a prompt's KV unclaimed this long is freed (the router gave up)
# ... or this long, when this engine's own requests are short of blocks: a decode worker pulls
# within milliseconds of the answer, and exports nobody came for must not stall everyone else
EXPORT_GRACE_S = 2.0


@dataclass
class KVExport:
    """A finished prompt's KV, its blocks pinned until read or expired."""
    request_id: str
    token_ids: list[int]  # the tokens whose KV the blocks hold, in order
    block_ids: list[int]
    images: list[tuple[str, int, int]]  # (content hash, offset, length) inside token_ids
    expires: float  # time.monotonic()


@dataclass
class KVPayload:
    """What travels over HTTP: the tokens, their images and their K/V rows over all layers."""
    layout: dict  # kv_layout() of the engine that computed it
    token_ids: list[int]
    images: list[tuple[str, int, int]]
    kv: torch.Tensor  # [layers, 2, tokens, kv_heads, head_dim] in the cache's dtype
    scales: torch.Tensor | None = None  # [layers, 2, tokens, kv_heads] for an int8 cache
    transport = "http"

    def fill(self, runner, block_ids: list[int], n: int) -> None:
        scatter_kv(runner, block_ids, self.kv[:, :, :n],
                   self.scales[:, :, :n] if self.scales is not None else None)

    def release(self) -> None:
        """(The exporter freed its blocks when it handed the payload out.)"""


@dataclass
class NixlSource:
    """KV still in the prefill engine's pool, read over NIXL straight into this pool."""
    layout: dict
    token_ids: list[int]
    images: list[tuple[str, int, int]]
    remote: dict  # the exporter's kv_nixl handshake
    remote_block_ids: list[int]
    request_id: str  # the exporter's: its blocks are freed when it hears this name back
    agent: object  # this engine's kv_nixl.NixlAgent
    transport = "nixl"

    def fill(self, runner, block_ids: list[int], n: int) -> None:
        self.agent.read(self.remote, self.remote_block_ids[:len(block_ids)], block_ids,
                        self.request_id)

    def release(self) -> None:
        """Tell the exporter to free its blocks without reading them."""
        self.agent.agent.send_notif(self.remote["agent"], self.request_id.encode())


@dataclass
class KVTransferStats:
    exported: int = 0  # prompts whose KV was held for a decode engine
    export_reads: int = 0  # ... and read by one
    export_expired: int = 0  # ... and freed unread after the TTL
    export_evicted: int = 0  # ... and freed unread after EXPORT_GRACE_S for this engine's requests
    imported_tokens: int = 0  # prompt tokens whose KV came from another engine
    imports: int = 0
    imports_by_transport: dict = field(default_factory=dict)
    import_failures: int = 0  # transfers that failed: the prompt was prefilled here instead
    failure_reasons: dict = field(default_factory=dict)

    def failed(self, reason: str) -> None:
        self.import_failures += 1
        self.failure_reasons[reason] = self.failure_reasons.get(reason, 0) + 1


def kv_layout(runner) -> dict:
    """What must agree between two engines for KV to move between them: the model's config
    and weights (weights_fingerprint), the weights' precision as loaded (dtype and
    quantization plan), the attention shape and the cache's dtype."""
    cached = getattr(runner, "_kv_layout", None)
    if cached is not None:
        return cached
    m = runner.model
    ident = hashlib.sha256(runner.hf_config.to_json_string(use_diff=False).encode())
    ident.update(weights_fingerprint(runner.model_dir).encode())
    plan = sorted((name, str(spec)) for name, spec in runner.quant_plan.items())
    ident.update(f"{runner.dtype}|{plan}".encode())
    runner._kv_layout = {"model": ident.hexdigest()[:16], "layers": len(m.layers),
                         "kv_heads": m.num_kv_heads, "head_dim": m.head_dim,
                         "dtype": str(runner.config.kv_torch_dtype).removeprefix("torch.")}
    return runner._kv_layout


def weights_fingerprint(model_dir, samples: int = 64, chunk: int = 1 << 16) -> str:
    """A cheap identity of a checkpoint's weights: each safetensors file's name and size and
    the sha256 of its header and of `samples` chunks spread evenly over the file (4 MiB read
    per file at most: hashing whole multi-GB files at every start would cost minutes)."""
    h = hashlib.sha256()
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        size = path.stat().st_size
        h.update(f"{path.name}|{size}|".encode())
        with open(path, "rb") as f:
            for k in range(samples + 1):
                f.seek(size * k // samples if k < samples else max(0, size - chunk))
                h.update(f.read(chunk))
    return h.hexdigest()


def layout_mismatch(mine: dict, theirs: dict) -> str | None:
    """The first field on which two kv_layout()s differ, as a sentence; None if they agree."""
    for key in ("model", "layers", "kv_heads", "head_dim", "dtype"):
        if mine.get(key) != theirs.get(key):
            return f"{key} differs ({theirs.get(key)!r} there, {mine.get(key)!r} here)"
    return None


def importable_tokens(prompt: list[int], images: list[tuple[str, int, int]],
                      payload: "KVPayload | NixlSource") -> int:
    """How many leading prompt tokens the payload's KV stands for: the common prefix of the
    token ids, cut before the first image that differs (same placeholder ids, other pixels),
    and never the prompt's last token, whose logits the decode engine computes itself."""
    n = 0
    for a, b in zip(prompt, payload.token_ids):
        if a != b:
            break
        n += 1
    n = min(n, len(prompt) - 1)
    theirs = {(off, length): h for h, off, length in payload.images}
    for h, off, length in sorted(images, key=lambda im: im[1]):
        if off >= n:
            break
        if theirs.get((off, length)) != h:
            n = off
            break
    return max(n, 0)


class KVExports:
    """Prompts whose KV waits for a decode engine, by request id (engine thread only)."""

    def __init__(self, block_manager, ttl_s: float = DEFAULT_EXPORT_TTL_S):
        self.bm = block_manager
        self.ttl_s = ttl_s
        self.held: dict[str, KVExport] = {}
        self.stats = KVTransferStats()
        self.nixl = None  # kv_nixl.NixlAgent when KV may leave over NIXL

    def release(self, request_id: str) -> None:
        export = self.held.pop(request_id, None)
        if export is not None:
            self.bm.unpin(export.block_ids)
            self.stats.export_reads += 1

    def hold(self, seq: Sequence) -> None:
        """Pin a finishing sequence's prompt blocks (called before its blocks are freed)."""
        n = min(seq.num_computed_tokens, seq.num_prompt_tokens)
        if n == 0 or seq.request_id in self.held:
            return
        blocks = seq.block_table[:self.bm.blocks_for(n)]
        self.bm.pin(blocks)
        images = ([(r.content_hash, r.offset, r.length) for r in seq.mm_inputs.overlapping(0, n)]
                  if seq.mm_inputs is not None else [])
        self.held[seq.request_id] = KVExport(seq.request_id, seq.token_ids[:n], blocks, images,
                                             time.monotonic() + self.ttl_s)
        self.stats.exported += 1

    def block_ids(self, request_id: str) -> list[int]:
        """The held blocks of a request (any thread: a read of one dict entry)."""
        export = self.held.get(request_id)
        return list(export.block_ids) if export is not None else []

    def take(self, runner, request_id: str) -> KVPayload | None:
        """The export's KV copied out, its blocks freed; None if unknown or expired."""
        export = self.held.pop(request_id, None)
        if export is None:
            return None
        try:
            kv, scales = gather_kv(runner, export.block_ids, len(export.token_ids))
        finally:
            self.bm.unpin(export.block_ids)
        self.stats.export_reads += 1
        return KVPayload(kv_layout(runner), export.token_ids, export.images, kv, scales)

    def expire(self, now: float | None = None) -> int:
        """Free what readers have read over NIXL, and what waited past the TTL."""
        if self.nixl is not None:
            for rid in self.nixl.read_notifications():
                self.release(rid)
        now = time.monotonic() if now is None else now
        late = [rid for rid, e in self.held.items() if e.expires < now]
        for rid in late:
            self.bm.unpin(self.held.pop(rid).block_ids)
        self.stats.export_expired += len(late)
        return len(late)

    def make_room(self, wanted: int, now: float | None = None) -> int:
        """Free the exports held past EXPORT_GRACE_S, oldest first, while fewer than `wanted`
        blocks are free; returns how many."""
        now = time.monotonic() if now is None else now
        freed = 0
        for rid in list(self.held):  # in the order they were held
            if self.bm.num_free_blocks >= wanted:
                break
            if self.held[rid].expires - self.ttl_s + EXPORT_GRACE_S > now:
                break
            self.bm.unpin(self.held.pop(rid).block_ids)
            freed += 1
        self.stats.export_evicted += freed
        return freed


def gather_kv(runner, block_ids: list[int], num_tokens: int):
    """K/V rows of the first num_tokens slots of `block_ids`, token-major, as a copy."""
    idx = torch.tensor(block_ids, dtype=torch.long, device=runner.kv_cache.device)
    kv = runner.kv_cache.index_select(2, idx)  # [L, 2, n_blocks, block, H, D]
    kv = kv.flatten(2, 3)[:, :, :num_tokens].contiguous().cpu()
    scales = None
    if runner.kv_scales is not None:
        s = runner.kv_scales.index_select(2, idx).flatten(2, 3)
        scales = s[:, :, :num_tokens].contiguous().cpu()
    return kv, scales


def scatter_kv(runner, block_ids: list[int], kv: torch.Tensor,
               scales: torch.Tensor | None) -> None:
    """Write token-major K/V rows (from gather_kv) into `block_ids` of this pool."""
    cache, bs = runner.kv_cache, runner.block_size
    n = kv.shape[2]
    for k, bid in enumerate(block_ids):
        lo, hi = k * bs, min((k + 1) * bs, n)
        if lo >= hi:
            break
        cache[:, :, bid, :hi - lo] = kv[:, :, lo:hi].to(cache.device)
        if scales is not None:
            runner.kv_scales[:, :, bid, :hi - lo] = scales[:, :, lo:hi].to(cache.device)


def import_into(runner, bm, seq: Sequence, source: KVPayload | NixlSource,
                stats: KVTransferStats) -> int:
    """Give a fresh sequence the source's KV for its leading tokens: fresh blocks, the rows
    written in, full blocks registered in the prefix cache. Returns the tokens imported; 0
    (the prompt is prefilled here as usual, the reason counted) when the source cannot be
    used."""
    problem = layout_mismatch(kv_layout(runner), source.layout)
    images = ([(r.content_hash, r.offset, r.length) for r in seq.mm_inputs.ranges]
              if seq.mm_inputs is not None else [])
    n = importable_tokens(seq.token_ids, images, source) if problem is None else 0
    reason = ("layout" if problem is not None else "prompt_mismatch" if n == 0
              else "no_room" if bm.blocks_for(n) > bm.num_free_blocks else None)
    if reason is None:
        bm.append_slots(seq, n)
        try:
            source.fill(runner, seq.block_table, n)
        except Exception as err:  # noqa: BLE001 - this request prefills instead
            log.warning("KV transfer for %r failed (%s); prefilling it here", seq.request_id, err)
            bm.unpin(seq.block_table)
            seq.block_table = []
            reason = "transfer"
    if reason is not None:
        try:
            source.release()
        except Exception:  # noqa: BLE001 - the exporter's TTL frees its blocks then
            log.warning("could not tell the exporter to free %r's KV", seq.request_id)
        stats.failed(reason)
        return 0
    seq.num_computed_tokens = n
    bm.commit(seq)
    seq.num_cached_tokens = n
    stats.imports += 1
    stats.imports_by_transport[source.transport] = \
        stats.imports_by_transport.get(source.transport, 0) + 1
    stats.imported_tokens += n
    return n


# --- wire format: a 4-byte header length, the JSON header, the K/V bytes, the scale bytes ---
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
           "int8": torch.int8}


def encode_payload(payload: KVPayload) -> bytes:
    header = {"layout": payload.layout, "token_ids": payload.token_ids,
              "images": payload.images, "kv_shape": list(payload.kv.shape),
              "scales": payload.scales is not None}
    head = json.dumps(header, separators=(",", ":")).encode()
    parts = [len(head).to_bytes(4, "little"), head, _raw(payload.kv)]
    if payload.scales is not None:
        parts.append(_raw(payload.scales))
    return b"".join(parts)


def decode_payload(data: bytes) -> KVPayload:
    """The payload encode_payload wrote; ValueError naming what is wrong otherwise."""
    if len(data) < 4:
        raise ValueError("KV payload is shorter than its header length")
    size = int.from_bytes(data[:4], "little")
    try:
        header = json.loads(data[4:4 + size])
        layout, shape = header["layout"], [int(x) for x in header["kv_shape"]]
        dtype = _DTYPES[layout["dtype"]]
        token_ids = [int(t) for t in header["token_ids"]]
        images = [(str(h), int(o), int(n)) for h, o, n in header["images"]]
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"KV payload header is malformed: {err}") from None
    if len(shape) != 5 or shape[2] != len(token_ids):
        raise ValueError(f"KV payload shape {shape} does not hold {len(token_ids)} tokens")
    body = memoryview(data)[4 + size:]
    kv_bytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    scale_bytes = math.prod(shape[:-1]) * 4 if header.get("scales") else 0
    if len(body) != kv_bytes + scale_bytes:
        raise ValueError(f"KV payload body is {len(body)} bytes, expected {kv_bytes + scale_bytes}")
    kv = torch.frombuffer(bytearray(body[:kv_bytes]), dtype=dtype).view(shape)
    scales = (torch.frombuffer(bytearray(body[kv_bytes:]), dtype=torch.float32).view(shape[:-1])
              if scale_bytes else None)
    return KVPayload(layout, token_ids, images, kv, scales)


def _raw(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()
