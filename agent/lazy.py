"""A heavy package loaded on first use, not when a module is imported:

    pd = lazy_module("pandas")   # beside the module's imports; pandas loads the first time pd.<name> is read

Every command imports the modules of its work at start-up, and ``--help`` or a refused argument needs none of the
packages they compute with (pandas alone is a large part of a command's start: docs/performance.md). The name
stands for the package itself: each attribute read imports it (under Python's import lock, so threads are safe)
and returns the package's own attribute, classes and functions alike (``isinstance(x, pd.DataFrame)`` holds).
"""
from __future__ import annotations

import importlib
import sys
from typing import Any

__all__ = ["lazy_module"]


class _Lazy:
    __slots__ = ("_name",)

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        return getattr(importlib.import_module(self._name), attr)

    def __repr__(self) -> str:
        return f"<{self._name}, loaded on first use>"


def lazy_module(name: str) -> Any:
    """The package ``name`` (already imported: itself), loaded the first time one of its attributes is read."""
    return sys.modules.get(name) or _Lazy(name)
