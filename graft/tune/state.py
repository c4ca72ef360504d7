"""The tune's measured points, one JSON line each in a state file beside --out, so an
interrupted tune resumes without replaying a point it finished.

The search is deterministic given its measurements: a resumed tune walks the same path and
takes every point found here instead of replaying it. The first line is the fingerprint (the
trace, model, speed, fixed options and candidates: what a measurement depends on; not the SLO,
so a tune under another SLO reuses every point); a state file of another tune is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

from graft.errors import GraftConfigError


def state_path(out: str | Path) -> Path:
    """tuned.yaml -> tuned.state.jsonl (beside it)."""
    out = Path(out)
    return out.with_name(out.stem + ".state.jsonl")


class PointLog:
    def __init__(self, path: str | Path, fingerprint: dict, fresh: bool = False):
        self.path = Path(path)
        self.fingerprint = fingerprint
        # (candidate key, replayed requests, repeat: 0 in the halving, 0.. in the finals)
        self.points: dict[tuple[str, int, int], dict] = {}
        self.resumed = 0
        if self.path.is_file() and not fresh:
            self._load()
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps({"fingerprint": fingerprint}) + "\n")

    def _load(self) -> None:
        lines = self.path.read_text().splitlines()
        if len(lines) > 1 and not _parses(lines[-1]):
            lines = lines[:-1]  # a line cut short by an interruption: that point runs again
            self.path.write_text("\n".join(lines) + "\n")
        from graft.loads import json_loads

        where = f"{self.path} (a tune state file: delete it or pass --fresh)"
        try:
            head = json_loads(lines[0], where)["fingerprint"] if lines else None
            points = {(p["key"], p["requests"], p.get("repeat", 0)): p
                      for p in (json_loads(line, where) for line in lines[1:] if line.strip())}
        except (KeyError, TypeError, AttributeError) as err:
            raise GraftConfigError(f"{self.path} is not a tune state file ({err}); delete it or "
                                   "pass --fresh") from None
        if head != self.fingerprint:
            changed = sorted(k for k in set(head or {}) | set(self.fingerprint)
                             if (head or {}).get(k) != self.fingerprint.get(k))
            raise GraftConfigError(f"{self.path} belongs to a tune with other settings "
                                   f"({', '.join(changed)} differ); use another --out or --fresh")
        self.points = points
        self.resumed = len(self.points)

    def get(self, key: str, requests: int, repeat: int = 0) -> dict | None:
        return self.points.get((key, requests, repeat))

    def add(self, point: dict) -> None:
        self.points[point["key"], point["requests"], point.get("repeat", 0)] = point
        with open(self.path, "a", encoding="utf-8") as fh:  # one line: a crash loses one point
            fh.write(json.dumps(point) + "\n")


def _parses(line: str) -> bool:
    try:
        json.loads(line)
        return True
    except (ValueError, RecursionError):  # JSONDecodeError, or an int past the digit limit
        return False
