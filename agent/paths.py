"""Names read from files, kept inside the directory they belong to.

A run line's ``tokens_file``, a stored image, a shard's files, a manifest's or an offline world's image names come
from files the toolkit did not just write (edited, merged from elsewhere, downloaded): before one is opened or
written it is resolved here and must stay inside its directory.
"""
from __future__ import annotations

from pathlib import Path

__all__ = ["PathEscape", "inside"]


class PathEscape(ValueError):
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
