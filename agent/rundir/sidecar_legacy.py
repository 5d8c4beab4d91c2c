"""Reading token sidecars of format 2 (runs written before format 3; ``python -m agent.rundir upgrade RUN``
rewrites them as format 3).

Format 2 stored the arrays in a private encoding that only this module reads: ``top_logprobs`` as IEEE bit
patterns delta-coded along each row (or float16 values), ``top_ids`` as ranks in a frequency-ordered dictionary
kept zstd-compressed in the file's metadata, and ``id`` / ``logprob`` only where they could not be read from the
top list at the position ``chosen`` names (null otherwise). Read with plain pyarrow those columns hold nulls and
integers, which is why format 3 stores every value as itself.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["FORMAT2", "decode_format2"]

FORMAT2 = b"2"
META_DICT = b"mmcf.top_id_dict"
META_LP = b"mmcf.top_logprobs"

#: What each derived column needs from the file.
_NEEDS = {"id": ("id", "chosen", "top_ids"), "logprob": ("logprob", "chosen", "top_logprobs")}


def _unpack_dict(blob: bytes) -> np.ndarray:
    """rank -> token id: int32 deltas stored as byte planes, zstd-compressed."""
    head, body = blob.split(b":", 1)
    n = int(head)
    if n == 0:
        return np.zeros(0, dtype=np.int32)
    planes = pa.decompress(body, decompressed_size=4 * n, codec="zstd", asbytes=True)
    raw = np.frombuffer(planes, dtype=np.uint8).reshape(4, n).T.copy()
    return np.cumsum(raw.view(np.int32).reshape(-1), dtype=np.int32)


def _undelta(delta: np.ndarray) -> np.ndarray:
    """The running sum along each row of an (n, k) int32 array, wrapping as int32 does (the bit-delta decode)."""
    out = np.array(delta, dtype=np.int32, copy=True, order="C")
    for j in range(1, out.shape[1]):
        np.add(out[:, j], out[:, j - 1], out=out[:, j])
    return out


def _matrix(col) -> np.ndarray:
    return col.flatten().to_numpy(zero_copy_only=False).reshape(-1, col.type.list_size)


def decode_format2(pf, meta: dict, want: list[str], plain) -> dict[str, np.ndarray]:
    """The per-token arrays ``want`` of an open format-2 ``pyarrow.parquet.ParquetFile``; ``plain`` converts a
    column stored as itself."""

    read = list(dict.fromkeys(x for c in want for x in _NEEDS.get(c, (c,))))
    t = pf.read(columns=read, use_threads=False)
    got = {name: t.column(name).combine_chunks() for name in t.column_names}
    cache: dict[str, np.ndarray] = {}

    def top_ids():
        if "top_ids" not in cache:
            ranks = _matrix(got["top_ids"])
            d = _unpack_dict(meta.get(META_DICT, b"0:"))
            ids = np.full(ranks.shape, -1, dtype=np.int32)
            ok = ranks >= 0
            ids[ok] = d[ranks[ok]]
            cache["top_ids"] = ids
        return cache["top_ids"]

    def top_lps():
        if "top_logprobs" not in cache:
            arr = _matrix(got["top_logprobs"])
            cache["top_logprobs"] = arr.astype(np.float32) if meta.get(META_LP) == b"float16" \
                else _undelta(arr).view(np.float32)
        return cache["top_logprobs"]

    out: dict[str, np.ndarray] = {}
    for name in want:
        if name == "top_ids":
            out[name] = top_ids()
        elif name == "top_logprobs":
            out[name] = top_lps()
        elif name in ("id", "logprob"):
            base = got[name].fill_null(-1 if name == "id" else np.nan).to_numpy(zero_copy_only=False).copy()
            chosen = got["chosen"].to_numpy(zero_copy_only=False).astype(np.int64)
            sel = np.flatnonzero(chosen >= 0)
            if len(sel):
                base[sel] = (top_ids() if name == "id" else top_lps())[sel, chosen[sel]]
            out[name] = base
        else:
            out[name] = plain(got[name], name)
    return out
