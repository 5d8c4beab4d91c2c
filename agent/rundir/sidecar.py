"""The token sidecar: one Parquet file per result line holding every generated token's arrays.

    data = encode(tokens_by_call, k=20, precision="float32")      # bytes of a Parquet file
    arrays = decode(path, columns=["call", "think", "top_logprobs"])

What a reader gets (``decode``), one row per generated token: ``call``, ``pos``, ``id``, ``text``,
``logprob``, ``think``, ``top_ids`` (n, k) int32 (-1 where absent), ``top_logprobs`` (n, k) float32 (NaN
where absent), ``exact_entropy``, and the adaptive release's ``release_kl`` / ``release_dH`` when present.

How it is stored (format 2; ours) — lossless:

- ``top_logprobs`` float32: each row's values as their IEEE bit patterns, delta-coded along the row
  (a row is sorted, so the deltas are small integers), byte-stream split, zstd. float16 (``--token-precision
  float16``, lossy): the values, byte-stream split.
- ``top_ids``: each id replaced by its rank in a per-file dictionary ordered by frequency (ties by id),
  byte-stream split: frequent alternatives get small ranks whose high bytes are zero. The dictionary
  (rank -> id) is stored delta-coded and zstd-compressed in the file's metadata.
- ``chosen``: where the chosen token sits in its own top list (-1: not in it). ``id`` and ``logprob`` are
  stored only where they cannot be read from the top list at that place (null otherwise).
- ``text`` dictionary-encoded; ``exact_entropy`` and the release columns byte-stream split.
- ``mmcf.prompt_pieces`` / ``mmcf.tokenizer`` (the Parquet file's key-value metadata, not the Arrow schema's, when
  the run's backend sent token ids): the ids of every distinct message piece of the line's prompts, by digest, and
  the fingerprint of the tokenizer that made them (agent/backends/pieces.py; read by :func:`read_prompt_pieces`).
  The probes send these ids again.

Files of format 1 (raw ``top_ids`` / ``top_logprobs`` / ``id`` / ``logprob`` columns, no ``mmcf.sidecar``
metadata) are read as before.
"""
from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..backends.pieces import pack_pieces, unpack_pieces
from ..http import scrub

__all__ = ["encode", "decode", "FORMAT", "RELEASE_COLUMNS", "token_table", "read_parquet", "rank_ids",
           "read_prompt_pieces"]

FORMAT = b"2"
#: Optional per-token columns of the adaptive image release (agent/methods/release.py).
RELEASE_COLUMNS = ("release_kl", "release_dH")
_META_FORMAT = b"mmcf.sidecar"
_META_DICT = b"mmcf.top_id_dict"
_META_LP = b"mmcf.top_logprobs"
_META_PIECES = b"mmcf.prompt_pieces"
_META_TOKENIZER = b"mmcf.tokenizer"


def read_parquet(path, columns: list[str] | None = None):
    """Read a Parquet file single-threaded.

    pyarrow's threaded reader (``pq.read_table``) intermittently aborts the interpreter at exit
    ("terminate called without an active exception", apache/arrow#34314; seen here with 26.0.1).
    """

    return pq.ParquetFile(path).read(columns=columns, use_threads=False)


def _fixed(arr2d: np.ndarray):
    n, k = arr2d.shape
    return pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(arr2d).reshape(-1)), k)


def _stack(tokens: dict, calls: list, name: str, k: int, dtype, fill) -> np.ndarray:
    n = sum(len(tokens[c]["id"]) for c in calls)
    out = np.full((n, k), fill, dtype=dtype)
    row = 0
    for c in calls:
        a = tokens[c].get(name)
        m = len(tokens[c]["id"])
        if a is not None and a.ndim == 2 and a.shape[1]:
            w = min(k, a.shape[1])
            out[row: row + m, :w] = a[:, :w]
        row += m
    return out


def _cat(tokens: dict, calls: list, name: str, dtype, fill=None) -> np.ndarray:
    parts = []
    for c in calls:
        a = tokens[c].get(name)
        parts.append(np.asarray(a).astype(dtype, copy=False) if a is not None
                     else np.full(len(tokens[c]["id"]), fill, dtype=dtype))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def rank_ids(top_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ranks, dictionary): ``dictionary[ranks] == top_ids`` where ids >= 0; the dictionary is ordered by
    frequency (most frequent first), ties by id, so ranks are small for frequent ids; -1 stays -1."""
    flat = top_ids.reshape(-1)
    valid = flat >= 0
    u, inv, cnt = np.unique(flat[valid], return_inverse=True, return_counts=True)
    order = np.lexsort((u, -cnt))
    rank_of = np.empty(len(u), dtype=np.int32)
    rank_of[order] = np.arange(len(u), dtype=np.int32)
    ranks = np.full(flat.shape, -1, dtype=np.int32)
    ranks[valid] = rank_of[inv]
    return ranks.reshape(top_ids.shape), u[order].astype(np.int32)


def _pack_dict(d: np.ndarray) -> bytes:
    delta = np.diff(d.astype(np.int64), prepend=0).astype(np.int32)  # within a count class ids ascend: small
    raw = delta.tobytes()
    # byte planes (as byte-stream split does) before zstd: the high bytes of small deltas are zeros
    planes = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 4).T.copy().tobytes() if raw else b""
    return b"%d:" % len(d) + pa.compress(planes, codec="zstd", asbytes=True)


def _unpack_dict(blob: bytes) -> np.ndarray:
    head, body = blob.split(b":", 1)
    n = int(head)
    if n == 0:
        return np.zeros(0, dtype=np.int32)
    planes = pa.decompress(body, decompressed_size=4 * n, codec="zstd", asbytes=True)
    raw = np.frombuffer(planes, dtype=np.uint8).reshape(4, n).T.copy()
    return np.cumsum(raw.view(np.int32).reshape(-1), dtype=np.int32)


def token_table(tokens: dict[int, dict[str, np.ndarray]], k: int, precision: str = "float32"):
    """The Arrow table (format 2) of a line's per-call token arrays (``{call: {name: array}}``)."""


    calls = sorted(tokens)
    k = max(int(k), 1)
    lens = [len(tokens[c]["id"]) for c in calls]
    n = sum(lens)
    call_col = np.repeat(np.asarray(calls, dtype=np.int16), lens) if calls else np.zeros(0, np.int16)
    pos_col = np.concatenate([np.arange(m, dtype=np.int32) for m in lens]) if calls else np.zeros(0, np.int32)
    ids = _cat(tokens, calls, "id", np.int32, -1)
    lps = _cat(tokens, calls, "logprob", np.float32, np.nan)
    top_ids = _stack(tokens, calls, "top_ids", k, np.int32, -1)
    top_lps = _stack(tokens, calls, "top_logprobs", k, np.float32, np.nan)
    # where the chosen token sits in its top list; id and logprob are then read from there
    hit = (top_ids == ids[:, None]) & (ids[:, None] >= 0)
    chosen = np.where(hit.any(axis=1), hit.argmax(axis=1), -1).astype(np.int8)
    rows = np.arange(n)
    at = np.where(chosen >= 0, chosen, 0)
    derivable = (chosen >= 0) & (top_lps[rows, at].view(np.int32) == lps.view(np.int32))
    chosen = np.where(derivable, chosen, -1).astype(np.int8)
    id_col = pa.array(ids, mask=derivable)
    lp_col = pa.array(lps, mask=derivable)
    ranks, dictionary = rank_ids(top_ids)
    if precision == "float16":
        lp_enc, lp_tag = _fixed(top_lps.astype(np.float16)), b"float16"
    else:
        bits = top_lps.view(np.int32)
        delta = np.empty_like(bits)
        if k:
            delta[:, 0] = bits[:, 0]
            np.subtract(bits[:, 1:], bits[:, :-1], out=delta[:, 1:])  # int32 wraps: exact both ways
        lp_enc, lp_tag = _fixed(delta), b"float32-bitdelta"
    texts = [x for c in calls for x in (tokens[c].get("text") if tokens[c].get("text") is not None
                                         else [None] * len(tokens[c]["id"]))]
    cols = {
        "call": call_col, "pos": pos_col, "chosen": chosen, "id": id_col,
        # each token's text (dictionary-encoded: a few bytes per token): the record reads without a tokenizer
        "text": pa.array(_scrubbed(texts, scrub), pa.string()),
        "logprob": lp_col, "think": _cat(tokens, calls, "think", bool, False),
        "top_ids": _fixed(ranks), "top_logprobs": lp_enc,
        "exact_entropy": _cat(tokens, calls, "exact_entropy", np.float32, np.nan),
    }
    for name in RELEASE_COLUMNS:  # --image-release adaptive: per-token KL / ΔH of each probed step
        if calls and any(name in tokens[c] for c in calls):
            cols[name] = _cat(tokens, calls, name, np.float32, np.nan)
    t = pa.table(cols)
    return t.replace_schema_metadata({_META_FORMAT: FORMAT, _META_DICT: _pack_dict(dictionary), _META_LP: lp_tag})


def _scrubbed(texts: list, scrub) -> list:
    """The texts, with lone surrogates replaced only when some text has one (one check for all)."""
    try:
        "".join(t for t in texts if t is not None).encode("utf-8")
        return texts
    except UnicodeEncodeError:
        return [scrub(t) if t is not None else None for t in texts]
    except TypeError:  # a non-str slipped in
        return [None if t is None else scrub(str(t)) for t in texts]


def encode(tokens: dict[int, dict[str, np.ndarray]], k: int, precision: str = "float32",
           prompt: tuple[str, dict] | None = None) -> bytes:
    """The sidecar file's bytes (Parquet, zstd); ``prompt``: (tokenizer fingerprint, {digest: ids}), the line's
    prompt pieces (agent/backends/pieces.py), kept in the file's metadata."""

    t = token_table(tokens, k, precision)
    split = [c for c in ("logprob", "top_ids.list.element", "top_logprobs.list.element", "exact_entropy",
                         *RELEASE_COLUMNS) if c.split(".")[0] in t.column_names]
    buf = io.BytesIO()
    with pq.ParquetWriter(buf, t.schema, compression="zstd", use_byte_stream_split=split,
                          use_dictionary=["text"]) as w:
        w.write_table(t)
        if prompt and prompt[0] and prompt[1]:

            # the file's key-value metadata only: the table schema's metadata is also stored inside the serialised
            # Arrow schema, base64-encoded, which kept these bytes twice (ours: 12.9 B a generated token, not 5.5)
            w.add_key_value_metadata({_META_TOKENIZER: str(prompt[0]).encode(), _META_PIECES: pack_pieces(prompt[1])})
    return buf.getvalue()


def read_prompt_pieces(path) -> tuple[str | None, dict[bytes, np.ndarray]]:
    """(tokenizer fingerprint, {digest: int32 ids}) of a sidecar's prompt pieces; ``(None, {})`` for a sidecar
    without them (an older run, a backend that sent text). Reads the file's footer only. A malformed record raises
    ValueError."""

    meta = pq.read_metadata(path).metadata or {}
    blob = meta.get(_META_PIECES)
    if blob is None:
        return None, {}

    fingerprint = meta.get(_META_TOKENIZER, b"").decode("ascii", "replace") or None
    if fingerprint is None:
        raise ValueError("prompt pieces without the fingerprint of their tokenizer")
    return fingerprint, unpack_pieces(blob)


#: What each derived column needs from the file.
_NEEDS = {"id": ("id", "chosen", "top_ids"), "logprob": ("logprob", "chosen", "top_logprobs")}


def decode(path, columns: list[str] | None = None) -> dict[str, np.ndarray]:
    """The per-token arrays of a sidecar (``columns`` to read only some; format 1 or 2)."""

    pf = pq.ParquetFile(path)
    schema = pf.schema_arrow  # built on each access: once
    meta = schema.metadata or {}
    names = schema.names
    want = list(columns) if columns is not None else [c for c in names if c != "chosen"]
    missing = [c for c in want if c not in names]
    if missing:
        raise ValueError(f"no column(s) {missing} in this sidecar")
    if meta.get(_META_FORMAT) != FORMAT:  # format 1: the arrays as they are
        t = pf.read(columns=want, use_threads=False)
        return {name: _plain(t.column(name), name) for name in t.column_names}
    read = list(dict.fromkeys(x for c in want for x in _NEEDS.get(c, (c,))))
    t = pf.read(columns=read, use_threads=False)
    got = {name: t.column(name).combine_chunks() for name in t.column_names}
    out: dict[str, np.ndarray] = {}
    cache: dict[str, np.ndarray] = {}

    def ranks():  # the alternatives' ranks in the file's id dictionary, (n, k) (-1: absent)
        col = got["top_ids"]
        return col.flatten().to_numpy(zero_copy_only=False).reshape(-1, col.type.list_size)

    def ids_of(r):  # ranks -> token ids, any shape (-1 stays -1)
        d = _unpack_dict(meta.get(_META_DICT, b"0:"))
        ids = np.full(r.shape, -1, dtype=np.int32)
        ok = r >= 0
        ids[ok] = d[r[ok]]
        return ids

    def top_ids():
        if "top_ids" not in cache:
            cache["top_ids"] = ids_of(ranks())
        return cache["top_ids"]

    def top_ids_at(rows, cols):
        """``top_ids()[rows, cols]`` without mapping the whole matrix: the chosen ids of a read of ``id`` alone (the
        teacher-forced probe's) map only their own ranks (ours: call, think and id of a 10,000-token sidecar read in
        2.6 ms instead of 4.9)."""
        return cache["top_ids"][rows, cols] if "top_ids" in cache else ids_of(ranks()[rows, cols])

    def top_lps():
        if "top_logprobs" not in cache:
            col = got["top_logprobs"]
            arr = col.flatten().to_numpy(zero_copy_only=False).reshape(-1, col.type.list_size)
            if meta.get(_META_LP) == b"float16":
                cache["top_logprobs"] = arr.astype(np.float32)
            else:
                cache["top_logprobs"] = _undelta(arr).view(np.float32)
        return cache["top_logprobs"]

    for name in want:
        if name == "top_ids":
            out[name] = top_ids()
        elif name == "top_logprobs":
            out[name] = top_lps()
        elif name in ("id", "logprob"):
            stored = got[name]
            base = stored.fill_null(-1 if name == "id" else np.nan).to_numpy(zero_copy_only=False)
            chosen = got["chosen"].to_numpy(zero_copy_only=False).astype(np.int64)
            sel = np.flatnonzero(chosen >= 0)
            if len(sel):
                base = base.copy()
                base[sel] = top_ids_at(sel, chosen[sel]) if name == "id" else top_lps()[sel, chosen[sel]]
            out[name] = base
        else:
            out[name] = _plain(got[name], name)
    return out


def _undelta(delta: np.ndarray) -> np.ndarray:
    """The running sum along each row of an (n, k) int32 array, wrapping as int32 does (the bit-delta decode).

    One in-place add per column: for the short rows of a top-k list this is ~2x faster than ``np.cumsum(axis=1)``,
    which pays a per-row loop start (measured: 0.34 vs 0.65 ms for 10,000 x 20; ours)."""
    out = np.array(delta, dtype=np.int32, copy=True, order="C")
    for j in range(1, out.shape[1]):
        np.add(out[:, j], out[:, j - 1], out=out[:, j])
    return out


def _plain(col, name: str) -> np.ndarray:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if name in ("top_ids", "top_logprobs"):
        arr = col.flatten().to_numpy(zero_copy_only=False).reshape(-1, col.type.list_size)
        return arr.astype(np.float32) if arr.dtype == np.float16 else arr
    if name == "text":
        return np.array(col.to_pylist(), dtype=object)
    return col.to_numpy(zero_copy_only=False)
