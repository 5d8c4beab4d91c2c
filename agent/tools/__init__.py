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
from .policy import DEFAULT_TOOLS, RELEASE_TOOLS, TOOL_POLICIES, ToolPolicy
from .registry import ImageRegistry, RegisteredImage
from .toolbox import TOOL_NAMES, CacheMiss, Toolbox, ToolResult

__all__ = ["make_toolbox", "Toolbox", "ToolResult", "ToolCache", "CacheMiss", "LiveProvider", "LensURL",
           "OfflineProvider", "ImageRegistry", "RegisteredImage", "MissingKeyError", "WorldError", "MODES", "TOOL_NAMES",
           "ToolPolicy", "DEFAULT_TOOLS", "RELEASE_TOOLS", "TOOL_POLICIES"]


def make_toolbox(kind: str = "offline", *, world_dir=None, cache_path=None, mode: str = "readwrite",
                 live_fallback: bool = False, visit_max_chars: int | None = None, thumbnail_dir=None,
                 tools: ToolPolicy = DEFAULT_TOOLS) -> Toolbox:
    """``thumbnail_dir``: where live Lens result images are saved (default: beside the cache, ``<cache>.images/``);
    ``tools``: the protocol's tool policy (:mod:`agent.tools.policy`; the release's has no cache)."""
    if kind == "offline":
        provider = OfflineProvider(world_dir or ensure_demo_world(), visit_max_chars=visit_max_chars,
                                   max_results=tools.max_results)
    elif kind == "live":
        if thumbnail_dir is None and cache_path:
            thumbnail_dir = str(cache_path) + ".images"
        provider = LiveProvider.from_env(visit_max_chars=visit_max_chars, thumbnail_dir=thumbnail_dir, tools=tools)
    else:
        raise ValueError(f"unknown tool provider {kind!r} (offline | live)")
    cache = ToolCache(cache_path) if cache_path and mode != "off" and tools.cache else None
    return Toolbox(provider, cache=cache, mode=mode if cache else "off", live_fallback=live_fallback, tools=tools)
