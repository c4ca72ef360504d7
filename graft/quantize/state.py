"""The resumable search state: every measured point, keyed by its assignment, in one JSON file.

The search is deterministic given its measurements, so resuming replays it from the start and
takes each point it has measured before from this file instead of measuring it again.
"""

from __future__ import annotations

from pathlib import Path

from graft.errors import GraftConfigError

STATE_FILE = "state.json"


class SearchState:
    def __init__(self, out_dir: str | Path, fingerprint: dict, fresh: bool = False):
        self.path = Path(out_dir) / STATE_FILE
        self.fingerprint = fingerprint
        self.points: dict[str, dict] = {}
        self.resumed = 0  # points taken from an earlier run
        if self.path.is_file() and not fresh:
            from graft.loads import json_loads

            try:
                text = self.path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as err:
                raise GraftConfigError(f"{self.path} is not a readable state file ({err}); delete "
                                       "it or pass --fresh") from None
            data = json_loads(text, f"{self.path} (delete it or pass --fresh)")
            old = data.get("fingerprint", {})
            changed = sorted(k for k in set(old) | set(fingerprint) if old.get(k) != fingerprint.get(k))
            if changed:
                raise GraftConfigError(f"{self.path} belongs to a search with other settings "
                                       f"({', '.join(changed)} differ); use another --out or --fresh")
            self.points = {p["key"]: p for p in data.get("points", [])}
            self.resumed = len(self.points)

    def get(self, key: str) -> dict | None:
        return self.points.get(key)

    def add(self, point: dict) -> None:
        self.points[point["key"]] = point
        self.save()

    def save(self) -> None:
        from graft.io import atomic_write_json

        atomic_write_json(self.path, {"fingerprint": self.fingerprint,
                                      "points": list(self.points.values())})
