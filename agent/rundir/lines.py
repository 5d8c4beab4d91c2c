"""A result line as bytes: sealed with its own checksum when written, and the one way a raw line is read back.

    data = seal(line)                  # b'{...,"line_sha256":"<64 hex>"}'  (no newline)
    line, state = read_line(raw)       # state: "ok" | "changed" | "torn"

The checksum travels with the line (ours): it is the SHA-256 of the line's JSON without the seal, written as the
line's last field, so whatever copies a run (``cp -r``, rsync, tar, a merge) copies the means to check it, and an
edited line is caught wherever the file lives, with or without the index beside it. A line that parses but whose
seal is missing or does not match its bytes has been **changed** since it was written: every reader leaves it out
and reports it (its unit reruns on resume). A line that does not parse is **torn** (a kill mid-write).
"""
from __future__ import annotations

import hashlib

from ..jsonio import dumps_record, loads

__all__ = ["SEAL_KEY", "seal", "read_line", "line_digest"]

#: The last field of every result line: the SHA-256 (hex) of the line's bytes before it (the line without it).
SEAL_KEY = "line_sha256"
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
