"""`graft serve --trace FILE`: one JSON line per finished request (graft.tune.trace's format),
written by a background thread so neither the event loop nor the engine thread waits on disk.

The engine thread only enqueues what it already holds (the job, its final output, the times);
building the line (image hashes, message dumps) and writing it happen on the writer thread.
FILE is rotated by size: FILE -> FILE.1 -> FILE.2 ... (at most BACKUPS old files are kept).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from pathlib import Path

log = logging.getLogger("graft.serving")

BACKUPS = 9  # rotated files kept beside FILE
_STOP = object()


class TraceWriter:
    def __init__(self, path: str | Path, content: bool = False, max_bytes: int = 64 << 20):
        self.path = Path(path)
        self.content = content  # messages (text, images as data URLs) in each line
        self.max_bytes = max_bytes
        self.written = 0  # lines written (tests, shutdown log)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")
        self._thread = threading.Thread(target=self._loop, name="graft-trace", daemon=True)
        self._thread.start()

    def record(self, job, out, status: str, now: float) -> None:
        """Called by the engine thread when a job ends (out: its final RequestOutput, or None
        when it ended before the engine, e.g. its deadline passed in the queue). Embeddings
        are left out: graft tune replays a trace as chats."""
        from graft.serving.engine.pooling import PoolingParams

        if isinstance(job.sampling_params, PoolingParams):
            return
        self._queue.put((job, out, status, now, time.time() - time.monotonic()))

    def close(self) -> None:
        """Write what is queued, then stop."""
        self._queue.put(_STOP)
        self._thread.join(timeout=30)
        self._file.close()

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            try:
                self._write(json.dumps(self.line(*item)) + "\n")
            except Exception:  # noqa: BLE001 - a trace line is never worth a request
                log.exception("could not write a trace line to %s", self.path)

    def _write(self, text: str) -> None:
        if self._file.tell() and self._file.tell() + len(text) > self.max_bytes:
            self._rotate()
        self._file.write(text)
        self._file.flush()  # a crash loses at most the line being written
        self.written += 1

    def _rotate(self) -> None:
        self._file.close()
        for k in range(BACKUPS - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{k}")
            if older.exists():
                older.replace(self.path.with_name(f"{self.path.name}.{k + 1}"))
        self.path.replace(self.path.with_name(f"{self.path.name}.1"))
        self._file = open(self.path, "a", encoding="utf-8")

    def line(self, job, out, status: str, now: float, wall_offset: float) -> dict:
        """The trace record of a finished job (wall_offset: time.time() - time.monotonic())."""
        from graft.digests import pixel_hash
        from graft.tune.trace import make_record

        req = job.request
        images = job.prepared.images if job.prepared is not None else []
        n_out = len(out.token_ids) if out is not None else job.n_output
        first = job.first_token_at
        tpot = (now - first) / (n_out - 1) * 1000 if first is not None and n_out > 1 else None
        params = job.sampling_params
        return make_record(
            arrival=job.arrival + wall_offset, model=job.graft,
            prompt_tokens=len(job.prompt_token_ids), output_tokens=n_out,
            images=[{"width": im.image.width, "height": im.image.height,
                     "sha256": pixel_hash(im.image), "tokens": im.n_tokens} for im in images],
            max_tokens=req.output_limit() if req is not None else params.max_tokens,
            temperature=params.temperature, stream=bool(req is not None and req.stream),
            status=status, finish_reason=out.finish_reason if out is not None else status,
            ttft_ms=(first - job.arrival) * 1000 if first is not None else None,
            tpot_ms=tpot, e2e_ms=(now - job.arrival) * 1000,
            encoder_cache_hit_tokens=sum(im.n_tokens for im in images) - job.encode_tokens,
            prefix_cache_hit_tokens=out.num_cached_tokens if out is not None else 0,
            # a /v1/completions prompt is not a chat: replayed as a stand-in of its length
            messages=([m.model_dump(exclude_none=True) for m in req.messages]
                      if self.content and hasattr(req, "messages") else None))
