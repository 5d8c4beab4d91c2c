"""A result line as bytes: sealed with its own checksum when written, and the one way a raw line is read back.

    data = seal(line)                  # b'{...,"line_sha256":"<64 hex>"}'  (no newline)
    line, state = read_line(raw)       # state: "ok" | "changed" | "torn"

The checksum travels with the line (ours): it is the SHA-256 of the line's JSON without the seal, written as the
line's last field, so whatever copies a run (``cp -r``, rsync, tar, a merge) copies the means to check it, and an
edited line is caught wherever the file lives, with or without the index beside it. A line that parses but whose
seal is missing or does not match its bytes has been **changed** since it was written: every reader leaves it out
and reports it (its unit reruns on resume). A line that does not parse is **torn** (a kill mid-write).

The grades and the probes' rows are sealed the same way (``seal``) and read back by :func:`read_sealed`, each row
also naming the seal of the result line it was computed from (``source_sha256``): a grade or a row edited since it
was written, or computed from a line the run no longer holds, is never counted (docs/reliability.md).
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from ..errors import writing
from ..jsonio import dumps_record, loads
from ..paths import open_regular, read_regular
from ..record import validate
from .common import RunError

__all__ = ["SEAL_KEY", "SOURCE_KEY", "seal", "read_line", "line_digest", "SealedRows", "read_sealed", "set_aside"]

#: The last field of every result line: the SHA-256 (hex) of the line's bytes before it (the line without it).
SEAL_KEY = "line_sha256"
#: The field of a grade or a probe's row naming the seal of the result line it was computed from.
SOURCE_KEY = "source_sha256"
_PREFIX = b',"' + SEAL_KEY.encode() + b'":"'
_TAIL = len(_PREFIX) + 64 + 2  # the prefix, the digest, '"}'


def seal(line: dict) -> bytes:
    """The line as one JSON object (redacted, agent.http.dumps_record) ending with its checksum; no newline. A seal
    the line already carries (a line read back and written again: a merge) is replaced."""
    body = dumps_record({k: v for k, v in line.items() if k != SEAL_KEY})
    if len(body) < 3 or not body.endswith(b"}"):
        raise ValueError("a result line must be a non-empty JSON object")
    return body[:-1] + _PREFIX + hashlib.sha256(body).hexdigest().encode() + b'"}'


def line_digest(raw: bytes) -> str | None:
    """The checksum a sealed line carries, when its bytes still match it; None when the line has no seal or its
    bytes changed since it was sealed. ``raw`` may end with its newline."""
    raw = raw[:-1] if raw.endswith(b"\n") else raw
    start = len(raw) - _TAIL
    if start < 1 or raw[start: start + len(_PREFIX)] != _PREFIX or not raw.endswith(b'"}'):
        return None
    digest = raw[start + len(_PREFIX): -2]
    if hashlib.sha256(raw[:start] + b"}").hexdigest().encode() != digest:
        return None
    return digest.decode()


def read_line(raw: bytes) -> tuple[dict, str]:
    """``(line, "ok")`` for an intact result line; ``({}, "torn")`` for bytes that are no line (cut by a kill, no
    newline, not a JSON object with ``sample_id`` and ``trial``); ``(line, "changed")`` for a line that parses but
    whose seal is missing or does not match (edited or damaged since it was written: never used as a record)."""
    if not raw.endswith(b"\n"):
        return {}, "torn"
    try:
        line = loads(raw)
    except ValueError:
        return {}, "torn"
    if not isinstance(line, dict) or "sample_id" not in line or "trial" not in line:
        return {}, "torn"
    return line, ("ok" if line_digest(raw) is not None else "changed")


@dataclass
class SealedRows:
    """A sealed JSONL file read back: the intact ``rows`` (each with its 1-based line number as ``_lineno``) and the
    line numbers of those ``changed`` since written (no seal, or a seal their bytes do not match) and ``torn`` (cut by
    a kill or a full disk: no record at all)."""

    path: Path
    rows: list = field(default_factory=list)
    changed: list = field(default_factory=list)
    torn: list = field(default_factory=list)
    changed_keys: list = field(default_factory=list)  # (sample_id, trial) of each changed line
    left_out: int = 0  # a reader's count of the lines it could not use (agent.rundir.probe_outputs.iter_rows)

    def problem(self) -> str | None:
        """One sentence naming the file and the lines that cannot be used as they are, or None."""
        parts = []
        if self.changed:
            parts.append(f"line(s) {_some(self.changed)} changed since written (their seal does not match)")
        if self.torn:
            parts.append(f"line(s) {_some(self.torn)} torn (cut mid-write)")
        return f"{self.path}: {'; '.join(parts)}" if parts else None


def _some(numbers: list, n: int = 8) -> str:
    head = ", ".join(map(str, numbers[:n]))
    return head + (f" and {len(numbers) - n} more" if len(numbers) > n else "")


class RowWriter:
    """The one writer of sealed rows (the grades, the probes' rows): each row checked against its record model
    (``kind``, agent/record/), sealed (redacted: :func:`seal`), written whole and flushed, so a kill keeps every row
    written (a torn last one is skipped by every reader) and a full disk names the file (agent.errors.writing),
    closing included. A context manager."""

    def __init__(self, path, kind: str):
        self.path, self.kind = Path(path), kind
        with writing(self.path):
            self.f = open(self.path, "ab")

    def append(self, row: dict, where: str):
        """Write ``row`` (``where``: what a row that is no valid record is named by); the record written, as its
        model."""
        record = validate(self.kind, row, where)
        with writing(self.path):
            self.f.write(seal(row) + b"\n")
            self.f.flush()
        return record

    def close(self) -> None:
        with writing(self.path):  # what a full disk left in its buffer fails again here
            self.f.close()

    def __enter__(self) -> "RowWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_sealed(path) -> SealedRows:
    """Every line of a sealed JSONL file (grades, a probe's rows): intact, changed or torn; an absent file holds no
    rows."""
    out = SealedRows(Path(path))
    out.rows = list(iter_sealed(out))
    return out


def iter_sealed(tally: SealedRows) -> Iterator[dict]:
    """The intact rows of the sealed JSONL file ``tally.path``, one at a time (each with its ``_lineno``), read line
    by line: memory holds one row, never the file (a probe's rows grow with the run). The changed and torn
    lines are noted in ``tally`` as they pass; an absent file yields nothing."""
    try:
        f = open_regular(tally.path, "rb", RunError)
    except FileNotFoundError:
        return
    with f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            row, state = read_line(raw)  # a last line without its newline: cut, however it parses
            if state == "ok":
                row["_lineno"] = n
                yield row
            elif state == "changed":
                tally.changed.append(n)
                tally.changed_keys.append((row["sample_id"], row["trial"]))
            else:
                tally.torn.append(n)


def set_aside(rows: SealedRows, also=()) -> Path | None:
    """Move the changed and torn lines of a sealed file (and the line numbers ``also``) into ``quarantine/<name>``
    beside it (appended, as they were), leaving the file with the other lines only; the quarantine file, or None
    when there was nothing to move. What a resume does before it redoes those rows."""
    bad = set(rows.changed) | set(rows.torn) | set(also)
    if not bad:
        return None
    data = read_regular(rows.path, RunError)
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    keep = b"".join(ln + b"\n" for n, ln in enumerate(lines, 1) if n not in bad and ln.strip())
    moved = b"".join(ln + b"\n" for n, ln in enumerate(lines, 1) if n in bad)
    q = rows.path.parent / "quarantine" / rows.path.name
    q.parent.mkdir(exist_ok=True)
    with open(q, "ab") as f:
        f.write(moved)
        f.flush()
        os.fsync(f.fileno())
    tmp = rows.path.with_name(f".{rows.path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(keep)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, rows.path)
    return q
