"""Shards of one run: which units shard I of N runs, and what its header records (ours; issue 26).

Which units a shard runs is a pure function of the run's ordered unit list (trial by trial, samples in
manifest order, as the runner orders them): unit j belongs to shard j mod N. Balanced (part sizes differ by at
most one) and needs no coordination. Used by the runner (``--shard I/N``), ``check`` and ``merge``.
"""
from __future__ import annotations

import hashlib

__all__ = ["shard_units", "shard_record", "units_sha"]


def _key(u) -> tuple[str, int]:
    s, t = u
    return (getattr(s, "id", s), int(t))


def shard_units(units: list, i: int, n: int) -> list:
    """Shard ``i`` of ``n``: unit j of the ordered list goes to shard j mod n."""
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"shard {i}/{n}: need 0 <= I < N")
    return [u for j, u in enumerate(units) if j % n == i]


def units_sha(units: list) -> str:
    h = hashlib.sha256()
    for sid, t in (_key(u) for u in units):
        h.update(f"{sid}\t{t}\n".encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def shard_record(units: list, i: int, n: int) -> dict:
    """What a shard's header records: which part of which unit list it holds."""
    return {"index": i, "of": n, "units": len(shard_units(units, i, n)), "all_units": len(units),
            "units_sha256": units_sha(units)}


