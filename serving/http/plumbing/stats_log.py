"""`graft serve`'s periodic stats line, like vLLM's: prompt and generation throughput over the
last interval, running and queued requests, KV-cache use and the encoder-cache hit rate.

Every number is read from the server's metrics (what /metrics shows), never from the engine's
internals. `--log-format json` writes this line, the startup line and uvicorn's own logs as
one JSON object per line.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from datetime import datetime, timezone

LOGGER = "graft.serving.stats"
LOG_FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, message, and a
    record's `stats` fields at the top level."""

    def format(self, record: logging.LogRecord) -> str:
        row = {"time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(
                   timespec="milliseconds"),
               "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        row.update(getattr(record, "stats", None) or {})
        if record.exc_info:
            row["exception"] = self.formatException(record.exc_info)
        return json.dumps(row)


_TEXT = "%(levelname)s %(asctime)s %(name)s: %(message)s"


def configure(log_format: str, uvicorn_level: str) -> dict | None:
    """Handlers for graft's serving loggers; returns uvicorn's `log_config` for JSON (None:
    uvicorn keeps its own text format)."""
    formatter = JsonFormatter() if log_format == "json" else logging.Formatter(_TEXT, "%m-%d %H:%M:%S")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    for name in ("graft.serving", LOGGER):  # the stats line shows at any --log-level
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.propagate = False
    logging.getLogger(LOGGER).setLevel(logging.INFO)
    if log_format != "json":
        return None
    json_handler = {"class": "logging.StreamHandler", "formatter": "json",
                    "stream": "ext://sys.stderr"}
    level = uvicorn_level.upper()
    return {"version": 1, "disable_existing_loggers": False,
            "formatters": {"json": {"()": JsonFormatter}},
            "handlers": {"json": json_handler},
            "loggers": {name: {"handlers": ["json"], "level": level, "propagate": False}
                        for name in ("uvicorn", "uvicorn.error", "uvicorn.access")}}


class StatsLogger:
    """Reads the metrics every `interval_s` and logs one line; `tick()` is one line now."""

    def __init__(self, metrics, interval_s: float, clock=time.monotonic):
        self.metrics, self.interval_s, self.clock = metrics, interval_s, clock
        self.log = logging.getLogger(LOGGER)
        self._gauges = {g.name: g.read for g in metrics.gauges}
        self._last = self._counters()
        self._last_at = clock()
        self._was_idle = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="graft-stats-log", daemon=True)

    def _counters(self) -> dict:
        m = self.metrics
        return {"prompt_tokens": m.prompt_tokens.value, "generation_tokens": m.generation_tokens.value,
                "finished": m.finished.value, "rejected_429": m.rejected_429.value,
                "cache_hits": self._gauges["graft_encoder_cache_hits"](),
                "cache_misses": self._gauges["graft_encoder_cache_misses"]()}

    def stats(self) -> dict:
        """The numbers since the last call (and the current gauges), as logged."""
        now, counters = self.clock(), self._counters()
        seconds = max(now - self._last_at, 1e-9)
        delta = {k: counters[k] - self._last[k] for k in counters}
        self._last, self._last_at = counters, now
        used, total = (self._gauges["graft_kv_blocks_used"](), self._gauges["graft_kv_blocks_total"]())
        lookups = delta["cache_hits"] + delta["cache_misses"]
        return {
            "interval_s": round(seconds, 3),
            "prompt_tokens_per_s": delta["prompt_tokens"] / seconds,
            "generation_tokens_per_s": delta["generation_tokens"] / seconds,
            "running": int(self._gauges["graft_running_requests"]()),
            "waiting": int(self._gauges["graft_queue_depth"]()),
            "finished": int(delta["finished"]), "rejected_429": int(delta["rejected_429"]),
            "kv_cache_usage": used / total if total else 0.0,
            "encoder_cache_hit_rate": self._gauges["graft_encoder_cache_hit_rate"](),
            "encoder_cache_hit_rate_interval": delta["cache_hits"] / lookups if lookups else None,
        }

    @staticmethod
    def format(s: dict) -> str:
        return (f"Avg prompt throughput: {s['prompt_tokens_per_s']:.1f} tokens/s, "
                f"Avg generation throughput: {s['generation_tokens_per_s']:.1f} tokens/s, "
                f"Running: {s['running']} reqs, Waiting: {s['waiting']} reqs, "
                f"Finished: {s['finished']} reqs, KV cache usage: {100 * s['kv_cache_usage']:.1f}%, "
                f"Encoder cache hit rate: {100 * s['encoder_cache_hit_rate']:.1f}%")

    def tick(self) -> dict | None:
        """Log one line (the stats), or nothing while the server stays idle after one idle line."""
        s = self.stats()
        idle = not (s["running"] or s["waiting"] or s["finished"] or s["rejected_429"]
                    or s["prompt_tokens_per_s"] or s["generation_tokens_per_s"])
        if idle and self._was_idle:
            return None
        self._was_idle = idle
        self.log.info(self.format(s), extra={"stats": s})
        return s

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - a logging fault must never stop the server
                self.log.exception("stats line failed")

    def start(self) -> "StatsLogger":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)


def add_arguments(p) -> None:
    """`graft serve`'s logging flags."""
    from graft.cli_types import number_in

    p.add_argument("--log-interval", type=number_in(float, low=0.0), default=10.0, metavar="S",
                   help="seconds between stats lines (throughput, running/waiting, KV and "
                        "encoder-cache use); 0: off")
    p.add_argument("--log-format", choices=LOG_FORMATS, default="text",
                   help="json: every server log line (stats, startup, uvicorn) as one JSON object")


def announce(message: str, log_format: str) -> None:
    """The startup line: stdout as text, or a JSON log record beside the others."""
    if log_format == "json":
        logging.getLogger(LOGGER).info(message, extra={"stats": {"event": "startup"}})
    else:
        print(message, flush=True)


class periodic:
    """`with periodic(metrics, interval_s):` a StatsLogger thread while the server runs
    (nothing when interval_s is 0)."""

    def __init__(self, metrics, interval_s: float):
        self.logger = StatsLogger(metrics, interval_s) if interval_s > 0 else None

    def __enter__(self):
        if self.logger is not None:
            self.logger.start()
        return self.logger

    def __exit__(self, *exc) -> None:
        if self.logger is not None:
            self.logger.stop()
