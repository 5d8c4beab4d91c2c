"""The one root of every error the toolkit raises on purpose, and its two kinds.

    ToolkitError            a command prints it as one line (``error: ...``) and exits non-zero, never a traceback
    ├── UsageError          what was asked cannot be done as asked: a bad argument, a directory that is not a run,
    │                       a missing key, a refused path, an image that is not one (fix the input, rerun)
    └── HarnessError        what the toolkit depends on failed: a model server, a damaged record, the tool cache
                            (fix the cause, rerun: what finished is kept)

A model's or a tool's mistake is not an exception of the toolkit: it goes back to the agent as an observation
(agent/parsing.py's ActionError is caught where the action is parsed). Each concrete error also keeps the builtin
base its callers catch (ValueError, OSError), so nothing that caught it before misses it now.
"""
from __future__ import annotations

__all__ = ["ToolkitError", "UsageError", "HarnessError"]


class ToolkitError(Exception):
    """Every error the toolkit raises on purpose."""


class UsageError(ToolkitError):
    """What was asked cannot be done as asked (the input is to fix)."""


class HarnessError(ToolkitError):
    """What the toolkit depends on failed (a server, a record, a cache)."""
