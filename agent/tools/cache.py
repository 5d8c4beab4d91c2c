"""Persistent record/replay cache for tool calls (SQLite, stdlib).

    cache = ToolCache("runs/tools.sqlite")           # every tool call goes through a Toolbox + cache

Keyed by tool + normalised arguments (for lens: the image's sha256 in place of its identifier); stores the raw API response,
the formatted observation, whether the call succeeded, whether a failure was transient, and a
timestamp. WAL mode and a busy timeout make it safe for many async workers and several processes at
once; ``INSERT OR IGNORE`` means the first writer wins and nothing is duplicated.

Modes (see :class:`~agent.tools.toolbox.Toolbox`): ``readwrite`` (default: hit -> cached, miss ->
live call, stored), ``replay`` (a miss is an error: replays are exactly reproducible), ``off``.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..choices import CACHE_MODES as MODES
from ..errors import HarnessError
from ..paths import require_regular

__all__ = ["ToolCache", "CacheEntry", "CacheCorrupt", "cache_key", "normalise_args", "MODES"]


_SCHEMA = """
CREATE TABLE IF NOT EXISTS tool_cache (
  key TEXT PRIMARY KEY,
  tool TEXT NOT NULL,
  args TEXT NOT NULL,
  raw TEXT,
  observation TEXT NOT NULL,
  ok INTEGER NOT NULL,
  transient INTEGER NOT NULL DEFAULT 0,
  created REAL NOT NULL
);
"""


def normalise_args(tool: str, args: dict) -> dict:
    """The arguments that decide a tool's result, normalised (``goal`` does not change results)."""
    out = {}
    for k, v in sorted(args.items()):
        if k == "goal":
            continue
        if isinstance(v, str):
            v = re.sub(r"\s+", " ", v.strip())
            if k == "url":
                v = v.rstrip("/") if v.count("/") > 3 else v
        out[k] = v
    return out


def cache_key(tool: str, args: dict, image_sha256: str | None = None, *, by_spelling: bool = False) -> str:
    """The call's key: the tool, its normalised arguments and, for Lens, the image's content hash in place of the
    identifier the model wrote (``<image_1>`` and ``<image_01>`` are one call). ``by_spelling``: the key the cache
    gave Lens calls before, the identifier's spelling included (still read, never written)."""
    args = normalise_args(tool, args)
    if tool == "lens_search" and image_sha256 and not by_spelling:
        args.pop("image_id", None)
    payload = json.dumps({"tool": tool, "args": args, "image": image_sha256}, sort_keys=True, ensure_ascii=False)
    # surrogatepass: whatever a model put into the arguments has a key (valid text hashes as before)
    return hashlib.sha256(payload.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass
class CacheEntry:
    raw: object
    observation: str
    ok: bool
    transient: bool
    created: float


class CacheCorrupt(HarnessError, OSError):
    """The tool cache file exists but is not a usable SQLite database (an OSError: commands exit 2 on it)."""


class ToolCache:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        require_regular(self.path, CacheCorrupt)  # a FIFO named tools.sqlite is named, never waited on
        try:
            with self._conn() as c:
                c.execute("PRAGMA journal_mode=WAL")
                c.executescript(_SCHEMA)
                c.execute("SELECT count(*) FROM tool_cache LIMIT 1").fetchone()
        except sqlite3.DatabaseError as e:
            raise CacheCorrupt(f"{self.path}: the tool cache is not a usable SQLite database ({e}). Move it aside to "
                               f"start a fresh cache (mv {self.path} {self.path}.corrupt; cached results are then paid "
                               "again in readwrite mode, and a replay cannot be exact), or restore it from a copy; "
                               "python -m agent.rundir check RUN_DIR reports it") from None

    def _conn(self) -> sqlite3.Connection:
        c = getattr(self._local, "conn", None)
        if c is None:
            c = sqlite3.connect(self.path, timeout=60, isolation_level=None)
            c.execute("PRAGMA busy_timeout=60000")
            c.execute("PRAGMA synchronous=NORMAL")
            self._local.conn = c
        return c

    def get(self, key: str) -> CacheEntry | None:
        row = self._conn().execute(
            "SELECT raw, observation, ok, transient, created FROM tool_cache WHERE key=?", (key,)).fetchone()
        if row is None:
            return None
        raw = json.loads(row[0]) if row[0] is not None else None
        return CacheEntry(raw, row[1], bool(row[2]), bool(row[3]), row[4])

    def put(self, key: str, tool: str, args: dict, raw, observation: str, ok: bool, transient: bool = False) -> None:
        c = self._conn()
        params = (key, tool, json.dumps(normalise_args(tool, args), ensure_ascii=False),
                  json.dumps(raw, ensure_ascii=False) if raw is not None else None, observation, int(ok),
                  int(transient), time.time())
        if transient:
            c.execute("INSERT OR IGNORE INTO tool_cache VALUES (?,?,?,?,?,?,?,?)", params)
        else:  # a good answer replaces a stored transient failure, never the other way round
            c.execute("INSERT INTO tool_cache VALUES (?,?,?,?,?,?,?,?) ON CONFLICT(key) DO UPDATE SET "
                      "raw=excluded.raw, observation=excluded.observation, ok=excluded.ok, transient=0, "
                      "created=excluded.created WHERE tool_cache.transient=1", params)

    def count(self) -> int:
        return self._conn().execute("SELECT COUNT(*) FROM tool_cache").fetchone()[0]

    def close(self) -> None:
        c = getattr(self._local, "conn", None)
        if c is not None:
            c.close()
            self._local.conn = None
