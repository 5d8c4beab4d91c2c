"""The agents' one entry point to tools: validate arguments, resolve images, go through the cache.

    tb = Toolbox(OfflineProvider(world), cache=ToolCache("tools.sqlite"), mode="readwrite")
    res = await tb.call("search", {"query": "kestrel observatory", "goal": "founding year"}, registry)
    res.observation, res.cache_hit, tb.stats

A model's mistakes (unknown tool, missing argument, unknown image id) and a tool's failures (no
results, blocked page, API error) come back as an observation with ``ok=False``: they go to the
agent and count toward its budget. Harness errors raise: a replay-mode cache miss
(:class:`CacheMiss`), a missing API key at start.
"""
from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import HarnessError
from ..redact import redact_obj
from .cache import MODES, ToolCache, cache_key
from .live import ProviderResult
from .policy import DEFAULT_TOOLS, ToolPolicy
from .registry import ImageRegistry

__all__ = ["Toolbox", "ToolResult", "CacheMiss", "TOOL_NAMES", "result_images", "lens_results"]

TOOL_NAMES = ("search", "visit", "lens_search")
_REQUIRED = {"search": "query", "visit": "url", "lens_search": "image_id"}


class CacheMiss(HarnessError, RuntimeError):
    """Replay mode found no cached result: the replay cannot be exact."""


@dataclass
class ToolResult:
    name: str
    args: dict
    observation: str
    ok: bool
    cache_hit: bool
    paid_calls: int = 0
    image_sha256: str | None = None
    raw: object = None
    images: list = field(default_factory=list)   # [(sha256, path)]: the result images (lens thumbnails)


def lens_results(raw) -> list[dict]:
    """The results whose image a provider saved for a call (``{"sha256", "path", "title", "link"}``), best first,
    from its raw record (cached with it). Live Lens keeps them under ``saved_thumbnails``, the offline world under
    ``thumbnails``; entries whose file is gone (a cache copied without its image folder) are skipped."""
    if not isinstance(raw, dict):
        return []
    return [r for r in raw.get("saved_thumbnails") or raw.get("thumbnails") or []
            if isinstance(r, dict) and r.get("sha256") and r.get("path") and Path(r["path"]).is_file()]


def result_images(raw) -> list[tuple[str, str]]:
    """The result images of a call as ``(sha256, path)``, best first (:func:`lens_results`)."""
    return [(r["sha256"], r["path"]) for r in lens_results(raw)]


@dataclass
class Toolbox:
    provider: object
    cache: ToolCache | None = None
    mode: str = "readwrite"
    live_fallback: bool = False  # replay mode: call the provider on a miss instead of failing
    stats: Counter = field(default_factory=Counter)
    tools: ToolPolicy = DEFAULT_TOOLS  # the protocol's: arguments as given or cleaned, cache on or off

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"cache mode must be one of {MODES}, got {self.mode!r}")
        if self.mode == "replay" and self.cache is None:
            raise ValueError("replay mode needs a cache")
        self._inflight: dict[str, asyncio.Future] = {}

    def require(self, tools=TOOL_NAMES) -> None:
        self.provider.require(tools)

    async def call(self, name: str, args: dict, registry: ImageRegistry | None = None) -> ToolResult:
        args = dict(args or {})
        if name not in TOOL_NAMES:
            return self._err(name, args, f"Unknown tool '{name}'. Available tools: {', '.join(TOOL_NAMES)}.")
        need = _REQUIRED[name]
        if self.tools.clean_args:
            val = args.get(need)
            if not isinstance(val, str) or not val.strip():
                return self._err(name, args, f"{name} needs a non-empty string argument '{need}'.")
            val = val.strip()
        else:  # as the model gave it, missing as "" (the release's params.get(name, ""))
            val = args.get(need, "")
        img = None
        if name == "lens_search":
            img = registry.resolve(val) if registry else None
            if img is None:
                ids = ", ".join(registry.ids) if registry and registry.ids else "none"
                return self._err(name, args, f"Unknown image id '{val}'. Registered query images: {ids}.")
        key = cache_key(name, args, img.sha256 if img else None)
        self.stats[f"{name}.calls"] += 1
        cached = self.cache is not None and self.mode != "off" and self.tools.cache
        if cached:
            hit = self.cache.get(key)
            if hit is None and img is not None:  # a cache written when Lens calls were keyed by the id's spelling
                hit = self.cache.get(cache_key(name, args, img.sha256, by_spelling=True))
            if hit is not None and (self.mode == "replay" or not hit.transient):
                self.stats["cache.hits"] += 1
                return ToolResult(name, args, hit.observation, hit.ok, True, 0, img.sha256 if img else None, hit.raw,
                                  result_images(hit.raw))
            if self.mode == "replay" and not self.live_fallback:
                self.stats["cache.misses"] += 1
                raise CacheMiss(f"replay mode: no cached result for {name}({args}) — the replay cannot be exact")
            self.stats["cache.misses"] += 1
        res = await (self._dedup(key, name, val, img) if self.tools.cache else self._provide(name, val, img))
        self.stats["paid_calls"] += res.paid_calls
        self.stats[f"{name}.paid"] += res.paid_calls
        # an API that echoes the key in a 200 body (seen in error texts): never cached, shown or recorded
        raw, observation = redact_obj(res.raw), redact_obj(res.observation)
        if cached:
            self.cache.put(key, name, args, raw, observation, res.ok, res.transient)
        return ToolResult(name, args, observation, res.ok, False, res.paid_calls, img.sha256 if img else None, raw,
                          result_images(raw))

    async def _dedup(self, key: str, name: str, val: str, img) -> ProviderResult:
        """Concurrent identical calls in this process share one provider call (one payment)."""
        fut = self._inflight.get(key)
        if fut is not None:
            res = await asyncio.shield(fut)
            return ProviderResult(res.observation, res.raw, res.ok, res.transient, 0)
        fut = asyncio.get_running_loop().create_future()
        self._inflight[key] = fut
        try:
            res = await self._provide(name, val, img)
            fut.set_result(res)
            return res
        except BaseException as e:
            fut.set_exception(e)
            fut.exception()  # mark retrieved
            raise
        finally:
            self._inflight.pop(key, None)

    async def _provide(self, name: str, val, img) -> ProviderResult:
        if name == "search":
            return await self.provider.search(val)
        if name == "visit":
            return await self.provider.visit(val)
        return await self.provider.lens(img)

    def _err(self, name: str, args: dict, msg: str) -> ToolResult:
        self.stats["invalid_calls"] += 1
        return ToolResult(name, args, msg, False, False)

    def summary(self) -> dict:
        return dict(self.stats)

    async def aclose(self) -> None:
        await self.provider.aclose()
        if self.cache is not None:
            self.cache.close()
