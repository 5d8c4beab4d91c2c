"""Retrieval tools (search, visit, lens_search) with a record/replay cache and an offline world.

    from agent.tools import make_toolbox
    tb = make_toolbox("offline")                         # the shipped demo world
    tb = make_toolbox("live", cache_path="runs/tools.sqlite", mode="readwrite")
"""
from __future__ import annotations

from .cache import MODES, ToolCache
from .demo_world import ensure_demo_world
from .live import LensURL, LiveProvider, MissingKeyError
from .offline import OfflineProvider, WorldError
from .registry import ImageRegistry, RegisteredImage
from .toolbox import TOOL_NAMES, CacheMiss, Toolbox, ToolResult

__all__ = ["make_toolbox", "Toolbox", "ToolResult", "ToolCache", "CacheMiss", "LiveProvider", "LensURL",
           "OfflineProvider", "ImageRegistry", "RegisteredImage", "MissingKeyError", "WorldError", "MODES", "TOOL_NAMES"]


def make_toolbox(kind: str = "offline", *, world_dir=None, cache_path=None, mode: str = "readwrite",
                 live_fallback: bool = False, visit_max_chars: int | None = None, thumbnail_dir=None) -> Toolbox:
    """``thumbnail_dir``: where live Lens result images are saved (default: beside the cache, ``<cache>.images/``)."""
    if kind == "offline":
        provider = OfflineProvider(world_dir or ensure_demo_world(), visit_max_chars=visit_max_chars)
    elif kind == "live":
        if thumbnail_dir is None and cache_path:
            thumbnail_dir = str(cache_path) + ".images"
        provider = LiveProvider.from_env(visit_max_chars=visit_max_chars, thumbnail_dir=thumbnail_dir)
    else:
        raise ValueError(f"unknown tool provider {kind!r} (offline | live)")
    cache = ToolCache(cache_path) if cache_path and mode != "off" else None
    return Toolbox(provider, cache=cache, mode=mode if cache else "off", live_fallback=live_fallback)
