"""The run index, ``results.index.jsonl``: one small entry per line of ``results.jsonl`` (its byte offset,
length and CRC-32, and the line without its events and messages), so a run of thousands of ~150 KB lines is
listed without parsing them. It is a cache that is never trusted blindly: a reader checks every entry's
checksum against the file (a line damaged in place is parsed again, and skipped if it no longer parses) and
parses whatever no entry covers; :class:`Lines` refuses a line that changed since it was indexed."""
from __future__ import annotations

import json
import os
import sys
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path

from ..http import dumps, dumps_record, loads
from .common import RunError, atomic_write


class RunIndex:
    """The index half of :class:`agent.rundir.RunDir` (``self.path``, ``self.results``)."""

    #: ``(sample_id, trial, byte offset)`` of each line the last :meth:`index` found changed since it was written
    changed: list = []

    # results.index.jsonl: one small entry per line of results.jsonl (its byte offset and length, and the
    # line without its events and messages), so that a run of thousands of ~150 KB lines is listed without
    # parsing them; the lines themselves are read one at a time when something needs them. The index is a
    # cache: the writer appends to it, and a reader checks it against results.jsonl and parses whatever it
    # does not cover (an older run, a crash between the two writes), rebuilding it when that is much.
    def index(self, *, warn: bool = True, verify: bool = True, project: Projection | None = None) -> list[dict]:
        """Summaries of every parseable line of results.jsonl in file order (with private ``_o``/``_n``/``_h``).

        ``project``: keep only what a reader needs of each summary (a function of the summary; the line's key and
        position are always kept), applied as each entry is read, so a reader of thousands of lines holds a few
        hundred bytes a line rather than its summary (~20 KB in memory for a 10-call line). A projecting reader
        never rewrites the index (a cache, rebuilt by the next full reader).

        ``verify``: each entry's checksum (``_h``, CRC-32 of its line's bytes) is checked against the file, so
        a line damaged in place (same inode, same length: a disk error) is parsed again — and, if it no longer
        parses, is a torn line like any other (its unit reruns on resume; nothing is graded or drawn from it).
        One sequential read of results.jsonl (~1 s per GB)."""
        if not self.results.exists():
            return []
        st = os.stat(self.results)
        size, ino = st.st_size, st.st_ino
        entries = self._read_index(size, ino, project)
        changed: list[dict] = []
        with open(self.results, "rb") as f:
            if entries and not _entries_fit(f, entries):
                entries = []
            if verify and entries:
                entries, changed = _entries_intact(f, entries)
            out, pos, scanned = [], 0, 0
            for e in sorted(entries + changed, key=lambda x: x["_o"]) + [None]:
                end = e["_o"] if e is not None else size
                if end > pos:  # bytes no entry covers: parse the lines there
                    got, n = _scan(f, pos, end, self.results, warn, project)
                    out += got
                    scanned += n
                if e is not None:
                    if e not in changed:
                        out.append(e)
                    pos = e["_o"] + e["_n"]
        self.changed = [(e.get("sample_id"), e.get("trial"), e["_o"]) for e in changed]
        if changed and warn:  # loud: a reader that used the line would report what was never recorded
            print(f"WARNING: {self.results}: {len(changed)} line(s) changed since they were written (edited or damaged "
                  f"in place), first {changed[0].get('sample_id')} trial {changed[0].get('trial')} at byte "
                  f"{changed[0]['_o']}: left out (their units rerun on resume); python -m agent.rundir check "
                  f"{self.path} lists them", file=sys.stderr)
        if project is None and (scanned > (1 << 20) or (not entries and out)):  # changed lines' entries kept: refused next time
            self._write_index(sorted(out + changed, key=lambda x: x["_o"]), ino)
        return out

    @property
    def index_path(self) -> Path:
        return self.path / "results.index.jsonl"

    def _read_index(self, size: int, ino: int, project: Projection | None = None) -> list[dict]:
        out = []
        try:
            with open(self.index_path, "rb") as f:  # entry by entry: the file is ~4 KB a 10-call line
                try:
                    head = json.loads(f.readline())
                    if head.get("index") != 1 or head.get("ino") != ino:
                        return []
                except ValueError:
                    return []
                for raw_e in f:
                    if not raw_e.strip():
                        continue
                    try:
                        e = json.loads(raw_e)
                    except ValueError:
                        continue  # a torn index entry: its line is parsed from results.jsonl instead
                    if isinstance(e, dict) and isinstance(e.get("_o"), int) and e["_o"] + e.get("_n", 0) <= size:
                        out.append(_projected(e, project))
        except OSError:
            return []
        out.sort(key=lambda e: e["_o"])
        # overlapping entries mean the index is stale: start again
        if any(a["_o"] + a["_n"] > b["_o"] for a, b in zip(out, out[1:])):
            return []
        return out

    def _write_index(self, entries: list[dict], ino: int) -> None:
        try:
            data = dumps({"index": 1, "ino": ino}) + b"\n" + b"".join(dumps(e) + b"\n" for e in entries)
            atomic_write(self.index_path, data)
        except (OSError, RunError):
            pass  # a cache: a read-only run directory is read without it

    def _append_index(self, line: dict, offset: int, length: int, crc: int | None = None) -> None:
        try:
            ino = os.stat(self.results).st_ino
            with open(self.index_path, "ab") as f:
                if f.tell() == 0:
                    f.write(dumps({"index": 1, "ino": ino}) + b"\n")
                f.write(dumps_record({**summary_of(line), "_o": offset, "_n": length, "_h": crc}) + b"\n")
        except OSError:
            pass  # the reader parses what the index lacks


SUMMARY_DROP = ("events", "messages")
#: a reader's projection of a line's summary (see :meth:`RunIndex.index`)
Projection = Callable[[dict], dict]
#: what every projected entry keeps: the unit's key and where its line is
KEEP = ("sample_id", "trial", "_o", "_n", "_h")


def _projected(e: dict, project: Projection | None) -> dict:
    if project is None:
        return e
    return {**project(e), **{k: e[k] for k in KEEP if k in e}}


def summary_of(line: dict) -> dict:
    return {k: v for k, v in line.items() if k not in SUMMARY_DROP}


def _entries_fit(f, entries: list[dict]) -> bool:
    """Each entry's bytes still hold a line there: '{' at its start, a newline at its end and before it."""
    for e in entries:
        o, n = e["_o"], e["_n"]
        f.seek(max(0, o - 1))
        before = f.read(1) if o else b"\n"
        f.seek(o)
        first = f.read(1)
        f.seek(o + n - 1)
        last = f.read(1)
        if before != b"\n" or first != b"{" or last != b"\n":
            return False
    return True


def _entries_intact(f, entries: list[dict]) -> tuple[list[dict], list[dict]]:
    """``(intact, changed)``: the entries whose line bytes still have the checksum written with them, and those
    whose bytes changed since (edited or damaged in place: never read as a record). Entries without a checksum,
    from an older index, cannot be vouched for: their lines are parsed again."""
    out, changed = [], []
    for e in entries:
        h = e.get("_h")
        if h is None:
            continue
        f.seek(e["_o"])
        (out if zlib.crc32(f.read(e["_n"])) == h else changed).append(e)
    return out, changed


def _scan(f, start: int, end: int, path, warn: bool, project: Projection | None = None) -> tuple[list[dict], int]:
    """Parse the lines in bytes [start, end) of results.jsonl: (their summaries, bytes scanned)."""

    f.seek(start)
    out, pos = [], start
    while pos < end:
        raw = f.readline(max(1, end - pos))
        if not raw:
            break
        o, pos = pos, pos + len(raw)
        if not raw.strip():
            continue
        try:
            line = loads(raw) if raw.endswith(b"\n") else None
            if not isinstance(line, dict) or "sample_id" not in line or "trial" not in line:
                raise ValueError
        except ValueError:
            if warn:
                print(f"warning: {path}: torn or malformed line at byte {o} ignored "
                      f"(its sample will be rerun on resume)", file=sys.stderr)
            continue
        out.append(_projected({**summary_of(line), "_o": o, "_n": len(raw), "_h": zlib.crc32(raw)}, project))
    return out, pos - start


class Lines(Sequence):
    """A run's latest lines, read from results.jsonl one at a time when accessed (nothing is kept):
    ``for line in run.lines`` holds one line in memory at a time; ``run.lines[i]`` parses line i."""

    def __init__(self, results: Path, index: list[dict]):
        self._results = results
        self._index = index

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._read(e) for e in self._index[i]]
        return self._read(self._index[i])

    def __iter__(self):
        with open(self._results, "rb") as f:
            for e in self._index:
                f.seek(e["_o"])
                yield _full(_checked(f.read(e["_n"]), e, self._results), e)

    def _read(self, e: dict) -> dict:
        with open(self._results, "rb") as f:
            f.seek(e["_o"])
            return _full(_checked(f.read(e["_n"]), e, self._results), e)


def _checked(raw: bytes, entry: dict, path) -> dict:
    """The line at an index entry, refused with the file and byte offset if it changed since it was indexed."""

    if entry.get("_h") is not None and zlib.crc32(raw) != entry["_h"]:
        raise RunError(f"{path}: the line at byte {entry['_o']} changed since the run was read (damaged on disk?); "
                       f"python -m agent.rundir check {Path(path).parent} reports it")
    try:
        return loads(raw)
    except ValueError as e:
        raise RunError(f"{path}: the line at byte {entry['_o']} does not parse ({e}); python -m agent.rundir check "
                       f"{Path(path).parent} reports it") from None


def _full(line: dict, entry: dict) -> dict:
    line["_o"], line["_n"] = entry["_o"], entry["_n"]
    return line
