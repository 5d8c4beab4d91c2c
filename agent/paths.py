"""Names read from files, kept inside the directory they belong to; files opened only when they are files.

A run line's ``tokens_file``, a stored image, a shard's files, a manifest's or an offline world's image names come
from files the toolkit did not just write (edited, merged from elsewhere, downloaded): before one is opened or
written it is resolved here and must stay inside its directory. Every file of a run is read through
:func:`open_regular`: a FIFO, a device or a socket where a file should be is refused by name, never waited on.
"""
from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from .errors import UsageError

__all__ = ["PathEscape", "NotAFile", "inside", "open_regular", "read_regular", "require_regular", "file_sha256"]


class PathEscape(UsageError, ValueError):
    """A name read from a file that leads outside the directory it belongs to."""


def inside(root, name, where: str, error: type[Exception] = PathEscape) -> Path:
    """``root / name`` when it stays inside ``root`` once resolved; otherwise ``error`` naming ``where`` (the file
    and line the name was read from). Refused: an absolute name, ``..`` leading out, and a symlink (the file itself
    or a folder on the way) that points outside ``root``."""
    root = Path(root)
    if not isinstance(name, str) or not name or "\x00" in name:
        raise error(f"{where}: {name!r} is not a file name")
    p = root / name
    if Path(name).is_absolute() or not p.resolve().is_relative_to(root.resolve()):
        raise error(f"{where}: {name!r} leads outside {root} (refused: a path read from a file must stay inside "
                    "its directory)")
    return p


class NotAFile(UsageError, OSError):
    """Something other than a regular file (a FIFO, a device, a socket) where a file is read."""


_KINDS = ((stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
          (stat.S_ISSOCK, "socket"), (stat.S_ISDIR, "directory"))


def _refusal(path, mode: int, error: type[Exception]) -> Exception:
    kind = next((name for test, name in _KINDS if test(mode)), "special file")
    return error(f"{path}: a {kind}, not a regular file (refused: reading it could wait forever)")


def open_regular(path, mode: str = "rb", error: type[Exception] = NotAFile):
    """``open(path, mode)`` (a read mode) when ``path`` is a regular file (a symlink to one included); otherwise
    ``error`` naming it. Opened non-blocking and checked on the open descriptor, so a FIFO is never waited on,
    even one put there after a check by name. A missing file raises FileNotFoundError as ``open`` does."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refusal(path, st.st_mode, error)
        os.set_blocking(fd, True)
        return os.fdopen(fd, mode, closefd=True) if "b" in mode else open(fd, mode, encoding="utf-8", closefd=True)
    except BaseException:
        os.close(fd)
        raise


def read_regular(path, error: type[Exception] = NotAFile) -> bytes:
    """The bytes of ``path``, a regular file (:func:`open_regular`)."""
    with open_regular(path, "rb", error) as f:
        return f.read()


def require_regular(path, error: type[Exception] = NotAFile) -> Path:
    """``path`` when it is a regular file or absent; ``error`` naming it otherwise. For files another library opens
    by name (SQLite)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return Path(path)
    if not stat.S_ISREG(mode):
        raise _refusal(path, mode, error)
    return Path(path)


def file_sha256(path, error: type[Exception] = NotAFile) -> str:
    """The sha256 of a regular file's bytes, read in 1 MiB pieces."""
    h = hashlib.sha256()
    with open_regular(path, "rb", error) as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
