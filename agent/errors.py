"""The one root of every error the toolkit raises on purpose, and its two kinds.

    ToolkitError            a command prints it as one line (``error: ...``) and exits non-zero, never a traceback
    ├── UsageError          what was asked cannot be done as asked: a bad argument, a directory that is not a run,
    │   │                   a missing key, a refused path, an image that is not one (fix the input, rerun)
    │   └── ConfigError     flags that cannot go together, or a value none of them takes (checked once, before work)
    └── HarnessError        what the toolkit depends on failed: a model server, a damaged record, the tool cache
                            (fix the cause, rerun: what finished is kept)

A model's or a tool's mistake is not an exception of the toolkit: it goes back to the agent as an observation
(agent/parsing.py's ActionError is caught where the action is parsed). Each concrete error also keeps the builtin
base its callers catch (ValueError, OSError), so nothing that caught it before misses it now.
"""
from __future__ import annotations

import asyncio
import contextlib
import errno
from pathlib import Path

__all__ = ["ToolkitError", "UsageError", "ConfigError", "HarnessError", "EXIT_DISK_FULL", "disk_full", "disk_full_message",
           "writing", "gather_all"]

#: The exit status of every command when the disk is full (ours): not a refusal (2), not failed units (3).
EXIT_DISK_FULL = 5


class ToolkitError(Exception):
    """Every error the toolkit raises on purpose."""


class UsageError(ToolkitError):
    """What was asked cannot be done as asked (the input is to fix)."""


class ConfigError(UsageError, ValueError):
    """Flags that cannot go together, or a value none of them takes: said before anything runs (exit 2)."""


class HarnessError(ToolkitError):
    """What the toolkit depends on failed (a server, a record, a cache)."""


def disk_full(e: BaseException | None) -> str | None:
    """None unless ``e`` (or what caused it) is "no space left on device"; then the file it names ('' if none)."""
    while e is not None:
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            return e.filename or ""
        e = e.__cause__ or e.__context__
    return None


def disk_full_message(e: BaseException, out, kept: str) -> str | None:
    """The one line a command prints when ``e`` is a full disk (None otherwise): the file it was writing (the one
    the error names when it lies in ``out``, else ``out``, the command's output), what is kept and how to resume."""
    full = disk_full(e)
    if full is None:
        return None
    out = Path(out)
    inside = bool(full) and (out.resolve() == Path(full).resolve() or out.resolve() in Path(full).resolve().parents)
    return (f"error: {full if inside else out}: the disk is full (No space left on device). {kept} are kept; free "
            f"space where {out} lives (df -h {out}), then rerun the same command to resume")


@contextlib.contextmanager
def writing(path):
    """An OSError raised inside names ``path`` (a failed ``write()`` names no file): what a full disk reports."""
    try:
        yield
    except OSError as e:
        if e.filename is None:
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise


async def gather_all(aws) -> list:
    """``asyncio.gather`` of ``aws``, but the first failure cancels and awaits the others before it is raised: one
    error is the command's message, never a task failing later against a closed file or client at shutdown."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
