"""Response cache for deterministic (greedy) requests, in one SQLite file.

Keyed by task name + version, sample id, model identity, generation settings, the
prompt text and the image bytes; failed requests are never cached, so a rerun retries them.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from pathlib import Path

from graft.errors import GraftConfigError
from graft.evals.backends.base import Request, Result
from graft.io import sha256_file



def default_cache_path() -> Path:
    """$GRAFT_CACHE (else ~/.cache/graft) / eval_responses.sqlite."""
    return Path(os.environ.get("GRAFT_CACHE") or "~/.cache/graft").expanduser() / "eval_responses.sqlite"


def cache_key(task: str, version: int, sample_id: str, identity: str, req: Request) -> str:
    blob = json.dumps({
        "task": task, "version": version, "sample": sample_id, "model": identity,
        "max_new_tokens": req.max_new_tokens, "temperature": req.temperature,
        "messages": req.messages,
        "images": [sha256_file(p) for p in req.images],  # content, so a rewritten image misses
    }, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


class ResponseCache:
    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path is not None else default_cache_path()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(str(self.path))
            self.db.execute("CREATE TABLE IF NOT EXISTS responses (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            self.db.commit()
        except (OSError, sqlite3.Error) as err:
            raise GraftConfigError(
                f"response cache {self.path} cannot be opened ({err}); pass --cache FILE in a "
                "writable folder, set GRAFT_CACHE, or use --no-cache") from None

    @staticmethod
    def cacheable(req: Request) -> bool:
        return req.temperature == 0

    def get(self, key: str) -> Result | None:
        row = self.db.execute("SELECT value FROM responses WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        data = json.loads(row[0])
        return Result(data["prediction"], latency=data.get("latency"), ttft=data.get("ttft"), cached=True)

    def put(self, key: str, result: Result) -> None:
        if result.error is not None or result.prediction is None:
            return
        value = json.dumps({"prediction": result.prediction, "latency": result.latency, "ttft": result.ttft})
        self.db.execute("INSERT OR REPLACE INTO responses (key, value) VALUES (?, ?)", (key, value))
        self.db.commit()

    def close(self) -> None:
        self.db.close()
