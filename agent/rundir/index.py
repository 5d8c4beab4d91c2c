"""The run index, ``results.index.jsonl``: one small entry per line of ``results.jsonl`` (its byte offset and
length, the checksum the line carries, and the line without its events and messages), so a run of thousands of
~150 KB lines is listed without parsing them. It is a cache that is never trusted: a reader checks every entry's
line against the checksum the line carries (agent/rundir/lines.py), parses whatever no intact entry covers, and
leaves out every line changed since it was written; :class:`Lines` refuses a line that changed since it was
indexed. Nothing in it depends on where the file lives: a copied run reads the same."""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from ..jsonio import dumps, dumps_record
from ..paths import open_regular, read_regular
from ..record import LineSummary, ResultLine, RunHeader, SchemaError, validate
from .common import RunError, atomic_write
from .lines import SEAL_KEY, line_digest, read_line

log = logging.getLogger(__name__)


class RunIndex:
    """A run's lines as its index lists them (``self.path``, ``self.results``): what :func:`agent.rundir.load_run`
    reads through, and the index half of the writer, :class:`agent.rundir.RunDir`."""

    path: Path
    results: Path

    def __init__(self, path):
        self.path = Path(path)
        self.results = self.path / "results.jsonl"

    def latest(self, project: Projection | None = None) -> dict[tuple[str, int], dict]:
        """The last line of each (sample, trial), as its summary (the line without ``events`` and ``messages``;
        :meth:`Run.full` reads the whole line), or what ``project`` keeps of it (:meth:`index`)."""
        out = {}
        for line in self.index(project=project):
            out[(line["sample_id"], int(line["trial"]))] = line
        return out

    #: ``(sample_id, trial, byte offset)`` of each line the last :meth:`index` found changed since it was written
    changed: list = []

    # results.index.jsonl: one small entry per line of results.jsonl (its byte offset and length, its checksum and
    # the line without its events and messages), so that a run of thousands of ~150 KB lines is listed without
    # parsing them; the lines themselves are read one at a time when something needs them. The index is a cache:
    # the writer appends to it, and a reader checks it against results.jsonl and parses whatever it does not cover
    # (a crash between the two writes, a deleted index), rebuilding it when that is much.
    def index(self, *, warn: bool = True, verify: bool = True, project: Projection | None = None) -> list[dict]:
        """Summaries of every intact line of results.jsonl in file order (each with the seal its line carries, ``line_sha256``, and its private position ``_o``/``_n``).

        ``project``: keep only what a reader needs of each summary (a function of the summary; the line's key and
        position are always kept), applied as each entry is read, so a reader of thousands of lines holds a few
        hundred bytes a line rather than its summary (~20 KB in memory for a 10-call line). A projecting reader
        never rewrites the index (a cache, rebuilt by the next full reader).

        ``verify``: each entry's line is checked against the checksum the line carries (agent/rundir/lines.py), so
        a line changed since it was written (edited, damaged, in a copy of the run) is parsed again, found changed
        and left out (its unit reruns on resume; nothing is graded or drawn from it). One sequential read of
        results.jsonl."""
        self.changed = []
        if not self.results.exists():
            return []
        size = os.stat(self.results).st_size
        entries = self._read_index(size, project)
        with open_regular(self.results, "rb", RunError) as f:
            if entries and not _entries_fit(f, entries):
                entries = []
            suspect: dict = {}
            if verify and entries:
                entries, suspect = _entries_intact(f, entries)
            out, pos, scanned, changed = [], 0, 0, []
            for e in entries + [None]:
                end = e["_o"] if e is not None else size
                if end > pos:  # bytes no intact entry covers: parse the lines there
                    got, n, bad = _scan(f, pos, end, self.results, warn, project, suspect)
                    out += got
                    changed += bad
                    scanned += n
                if e is not None:
                    out.append(e)
                    pos = e["_o"] + e["_n"]
        self.changed = changed
        if changed and warn:  # loud: a reader that used the line would report what was never recorded
            sid, trial, at = changed[0]
            log.warning(f"WARNING: {self.results}: {len(changed)} line(s) changed since they were written (edited or damaged; "
                        f"their checksums do not match), first {sid} trial {trial} at byte {at}: left out (their units "
                        f"rerun on resume); python -m agent.rundir check {self.path} lists them")
        if project is None and (scanned > (1 << 20) or (not entries and out)):
            self._write_index(out)
        return out

    @property
    def index_path(self) -> Path:
        return self.path / "results.index.jsonl"

    def _read_index(self, size: int, project: Projection | None = None) -> list[dict]:
        out = []
        try:
            with open_regular(self.index_path, "rb") as f:  # entry by entry: the file is ~4 KB a 10-call line
                try:
                    head = json.loads(f.readline())
                    if head.get("index") != INDEX_FORMAT:
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
                    if (isinstance(e, dict) and isinstance(e.get("_o"), int) and isinstance(e.get("_n"), int)
                            and e["_o"] + e["_n"] <= size):
                        out.append(_projected(e, project))
        except OSError:
            return []
        out.sort(key=lambda e: e["_o"])
        # overlapping entries mean the index is stale: start again
        if any(a["_o"] + a["_n"] > b["_o"] for a, b in zip(out, out[1:])):
            return []
        return out

    def _write_index(self, entries: list[dict]) -> None:
        try:
            data = dumps({"index": INDEX_FORMAT}) + b"\n" + b"".join(dumps(e) + b"\n" for e in entries)
            atomic_write(self.index_path, data)
        except (OSError, RunError):
            pass  # a cache: a read-only run directory is read without it

    def _append_index(self, line: dict, offset: int, length: int, digest: str) -> None:
        try:
            with open(self.index_path, "ab") as f:
                if f.tell() == 0:
                    f.write(dumps({"index": INDEX_FORMAT}) + b"\n")
                f.write(dumps_record({**summary_of(line), SEAL_KEY: digest, "_o": offset, "_n": length}) + b"\n")
        except OSError:
            pass  # the reader parses what the index lacks


def read_header(path) -> tuple[dict, RunHeader]:
    """A run directory's header: (its JSON, its model); an edited or damaged header is a :class:`RunError` naming
    it, never a traceback."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise RunError(f"{path} is a file, not a run directory (give a directory, new or of a run)")
    header_path = path / "header.json"
    try:
        header = json.loads(read_regular(header_path, RunError))
    except FileNotFoundError:
        raise RunError(f"{path}: no header.json — not a run directory") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RunError(f"{header_path}: unreadable header ({e})") from None
    if not isinstance(header, dict):
        raise RunError(f"{header_path}: the header is a {type(header).__name__}, not an object")
    try:
        return header, validate("header", header, str(header_path))
    except SchemaError as e:
        raise RunError(str(e)) from None


#: The index's format: entries hold the checksum their line carries (its own ``line_sha256``), nothing about where
#: the file lives.
INDEX_FORMAT = 3
SUMMARY_DROP = ("events", "messages")
#: a reader's projection of a line's summary (see :meth:`RunIndex.index`)
Projection = Callable[[dict], dict]
#: what every projected entry keeps: the unit's key and where its line is
KEEP = ("sample_id", "trial", SEAL_KEY, "_o", "_n")
#: the summary's fields every reader's summary keeps: the unit's key and its line's seal
KEY_FIELDS = frozenset(("sample_id", "trial", SEAL_KEY))


def position(entry: dict) -> dict:
    """Where an entry's line is in results.jsonl (offset, length) and the seal it carries: what :class:`Lines`
    reads it by."""
    return {"_o": entry["_o"], "_n": entry["_n"], SEAL_KEY: entry.get(SEAL_KEY)}


def summary_model(entry: dict, where: str, fields: frozenset[str] | None = None) -> LineSummary:
    """An index entry as the summary's model: validated whole, or (``fields``) only those fields, taken as the
    sealed line holds them (a field it does not name is refused when read)."""
    summary = {k: v for k, v in entry.items() if k not in ("_o", "_n")}
    if fields is not None:  # checked once by the reader (plain_fields)
        kept = LineSummary.model_construct(_fields_set=set(summary), **summary)
        for name in set(kept.__dict__) - set(summary):  # no default stands in for a field not kept: reading it fails
            del kept.__dict__[name]
        return kept
    try:
        return validate("summary", summary, f"{where} ({entry.get('sample_id')} trial {entry.get('trial')})")
    except SchemaError as e:
        raise RunError(f"{e}; python -m agent.rundir check {Path(where).parent} lists such lines") from None


#: the summary's fields that hold records of their own (validated only with the whole summary)
NESTED = ("calls", "tool_usage", "image_unload", "replay_of")


def plain_fields(fields) -> frozenset[str]:
    """``fields`` with the unit's key and seal: what a reader may keep of each summary (each a field of the summary
    that holds no records of its own); ValueError naming the others."""
    keep = frozenset(fields) | KEY_FIELDS
    bad = sorted(f for f in keep if f not in LineSummary.model_fields or f in NESTED)
    if bad:
        raise ValueError(f"not a plain field of a line's summary: {', '.join(bad)}")
    return keep


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


def _entries_intact(f, entries: list[dict]) -> tuple[list[dict], dict]:
    """``(intact, suspect)``: the entries whose line still carries the checksum the entry was written with and
    whose bytes still match it, and ``{offset: entry}`` of the others, whose lines are parsed again (a line that no
    longer parses where a sealed one was written is a line changed in place, not a torn write)."""
    out, suspect = [], {}
    for e in entries:
        f.seek(e["_o"])
        if e.get(SEAL_KEY) is not None and line_digest(f.read(e["_n"])) == e[SEAL_KEY]:
            out.append(e)
        else:
            suspect[e["_o"]] = e
    return out, suspect


def _scan(f, start: int, end: int, path, warn: bool, project: Projection | None = None, suspect: dict | None = None):
    """Parse the lines in bytes [start, end) of results.jsonl: ``(summaries of the intact lines, bytes scanned,
    [(sample_id, trial, offset)] of the lines changed since they were written)``."""

    f.seek(start)
    out, changed, pos = [], [], start
    while pos < end:
        raw = f.readline(max(1, end - pos))
        if not raw:
            break
        o, pos = pos, pos + len(raw)
        if not raw.strip():
            continue
        line, state = read_line(raw)
        if state == "torn" and suspect and o in suspect:  # a sealed line was written here: damaged in place
            line, state = suspect[o], "changed"
        if state == "torn":
            if warn:
                log.warning(f"warning: {path}: torn or malformed line at byte {o} ignored "
                            f"(its sample will be rerun on resume)")
        elif state == "changed":
            changed.append((line.get("sample_id"), line.get("trial"), o))
        else:
            out.append(_projected({**summary_of(line), "_o": o, "_n": len(raw)}, project))
    return out, pos - start, changed


class Lines(Sequence):
    """A run's latest lines as :class:`agent.record.ResultLine`, read from results.jsonl one at a time when accessed
    (nothing is kept): ``for line in run.lines`` holds one line in memory at a time; ``run.lines[i]`` parses line i.
    ``index``: each line's :func:`position`."""

    def __init__(self, results: Path, index: list[dict]):
        self._results = results
        self._index = index

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._read(e) for e in self._index[i]]
        return self._read(self._index[i])

    def __iter__(self) -> Iterator[ResultLine]:
        with open_regular(self._results, "rb", RunError) as f:
            for e in self._index:
                f.seek(e["_o"])
                yield _checked(f.read(e["_n"]), e, self._results)

    def _read(self, e: dict) -> ResultLine:
        with open_regular(self._results, "rb", RunError) as f:
            f.seek(e["_o"])
            return _checked(f.read(e["_n"]), e, self._results)


def raw_line(results: Path, entry: dict) -> dict:
    """The line at an index entry (or :func:`position`) as the file holds it (a dict, for the writer's own use: a
    merge writes it again), refused as :class:`Lines` refuses it."""
    with open_regular(results, "rb", RunError) as f:
        f.seek(entry["_o"])
        return _intact(f.read(entry["_n"]), entry, results)


def _intact(raw: bytes, entry: dict, path) -> dict:
    line, state = read_line(raw)
    if state != "ok" or line[SEAL_KEY] != entry.get(SEAL_KEY):
        raise RunError(f"{path}: the line at byte {entry['_o']} changed since the run was read (its checksum does not "
                       f"match); python -m agent.rundir check {Path(path).parent} reports it")
    return line


def _checked(raw: bytes, entry: dict, path) -> ResultLine:
    """The line at an index entry as its model, refused with the file and byte offset if it changed since it was
    indexed or is no valid result record."""
    line = _intact(raw, entry, path)
    try:
        return validate("result", line, f"{path} (line at byte {entry['_o']})")
    except SchemaError as e:
        raise RunError(f"{e}; python -m agent.rundir check {Path(path).parent} lists such lines") from None
