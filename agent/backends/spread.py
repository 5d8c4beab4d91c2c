"""Several model servers of one model used as one backend, each trajectory kept on one server.

    from agent.backends.spread import Spread, pin
    backend = Spread([make_backend("sglang", endpoint=u, ...) for u in urls])
    async def trajectory(key):
        pin(backend, key)            # every request of this task goes to the server this key was given
        await backend.generate(...)

Why pin: a probe's requests for one trajectory share long prefixes (its steps, its removal replays), and
only the server that served the first of them holds that prefix in its radix cache. A key is given the
least busy server the first time it is seen (ties: the one given fewest keys), and keeps it. Unpinned
requests (the annotator's, one per trajectory) go to the least busy server. The pin lives in a context
variable, so it is per asyncio task: ``asyncio.gather`` of one coroutine per trajectory pins each apart.

``agent.preflight.model_identity(spread)`` asks every server which model it serves and refuses servers that
disagree: spreading one probe over two different models would mix them in one figure.
"""
from __future__ import annotations

import contextvars

from .base import route

__all__ = ["Spread", "pin", "BackendPool"]

_PIN: contextvars.ContextVar = contextvars.ContextVar("mmcf_spread_pin", default=None)


def pin(backend, key) -> None:
    """Keep the current task's requests on one server of ``backend``: ours over several endpoints, smg's sticky
    sessions behind one gateway URL (the routing key)."""
    route(key)
    if isinstance(backend, Spread):
        _PIN.set((id(backend), backend.assign(key)))


class BackendPool:
    """The least busy of several backends (ties: the one given fewest units); agent.run hands each trajectory
    one with :meth:`acquire` and it keeps it for all its calls."""

    def __init__(self, backends: list):
        self.backends = backends
        self.busy = [0] * len(backends)
        self.given = [0] * len(backends)

    def least_busy(self) -> int:
        return min(range(len(self.backends)), key=lambda j: (self.busy[j], self.given[j]))

    def acquire(self) -> int:
        i = self.least_busy()
        self.busy[i] += 1
        self.given[i] += 1
        return i

    def release(self, i: int) -> None:
        self.busy[i] -= 1


class Spread:
    name = "spread"

    def __init__(self, backends: list):
        if not backends:
            raise ValueError("Spread needs at least one backend")
        self.backends = list(backends)
        self.pool = BackendPool(self.backends)
        self.keys: dict = {}

    def __getattr__(self, name):  # model, semantics, model_dir, ...: the servers serve one model
        if name in ("backends", "pool", "keys"):
            raise AttributeError(name)
        return getattr(self.backends[0], name)

    def assign(self, key) -> int:
        if key not in self.keys:
            i = self.pool.least_busy()
            self.pool.given[i] += 1
            self.keys[key] = i
        return self.keys[key]

    def _pick(self) -> int:
        p = _PIN.get()
        return p[1] if p is not None and p[0] == id(self) else self.pool.least_busy()

    async def _call(self, method: str, *args, **kw):
        i = self._pick()
        self.pool.busy[i] += 1
        try:
            return await getattr(self.backends[i], method)(*args, **kw)
        finally:
            self.pool.release(i)

    async def generate(self, *args, **kw):
        return await self._call("generate", *args, **kw)

    async def score(self, *args, **kw):
        return await self._call("score", *args, **kw)

    def prepare(self, mode: str) -> None:
        for b in self.backends:
            getattr(b, "prepare", lambda m: None)(mode)

    async def aclose(self) -> None:
        for b in self.backends:
            await b.aclose()
