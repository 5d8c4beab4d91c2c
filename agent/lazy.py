"""A heavy package loaded on first use, not when a module is imported:

    pd = lazy_module("pandas")   # beside the module's imports; pandas loads the first time pd.<name> is read

and a package whose public names load from their modules when first read (PEP 562), so that importing the package
to run one of its commands loads nothing of the work before the arguments parse:

    __getattr__, __dir__ = lazy_exports(__name__, {"run": ".runner", "RunConfig": ".config"})

Every command imports the modules of its work at start-up, and ``--help`` or a refused argument needs none of the
packages they compute with (pandas alone is a large part of a command's start: docs/performance.md). The name
stands for the package itself: each attribute read imports it (under Python's import lock, so threads are safe)
and returns the package's own attribute, classes and functions alike (``isinstance(x, pd.DataFrame)`` holds).
"""
from __future__ import annotations

import importlib
import sys
from typing import Any

__all__ = ["lazy_module", "lazy_exports"]


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


def lazy_exports(package: str, names: dict[str, str]):
    """A package's ``__getattr__`` and ``__dir__`` (PEP 562): each of ``names`` is imported from its module (relative
    to ``package``) the first time it is read, then kept on the package. ``from package import name`` works as
    with an eager import; a misspelled name is an AttributeError, as always."""
    def __getattr__(name: str):
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(names))

    return __getattr__, __dir__
