"""The token sidecar: one plain Parquet file per result line holding every generated token's arrays.

    data = encode(tokens_by_call, k=20, precision="float32")      # bytes of a Parquet file
    arrays = decode(path, columns=["call", "think", "top_logprobs"])

A sidecar (format 3) is a table any Parquet reader opens as it is (pyarrow, pandas, polars, duckdb, Hugging Face
``datasets``), one row per generated token, every value stored as itself:

======================  ==================  ==========================================================
column                  type                what
======================  ==================  ==========================================================
``call``                int16               the result line's call (``events[i].index`` of an llm_call)
``pos``                 int32               the token's position in that call's completion
``id``                  int32               the token id (null: the server gave no ids)
``text``                string              the token's text (dictionary-encoded)
``logprob``             float32             its log-probability (null: none returned)
``think``               bool                inside the reasoning (``<think>...</think>``)
``top_ids``             list<int32>         the top-k alternatives' ids, most likely first (null: no ids)
``top_logprobs``        list<float32>       their log-probabilities (null: none)
``exact_entropy``       float32             the full-vocabulary entropy where the local backend computed it
``unload_kl/_dH``      float32             the adaptive image unloading's per-token KL / ΔH (when present)
======================  ==================  ==========================================================

A position with fewer than k alternatives has a shorter list. Compression is Parquet's own: zstd, with the
byte-stream-split encoding for the numbers. The file's key-value metadata holds ``mmcf.sidecar`` (``3``),
``mmcf.top_k``, ``mmcf.precision`` (``float16``: the alternatives' values were rounded to float16 and are stored
as float32, lossy on purpose) and, when the backend sent token ids, ``mmcf.prompt_pieces`` / ``mmcf.tokenizer``:
the ids of every distinct message piece of the line's prompts and the tokenizer's fingerprint
(agent/backends/pieces.py; read by :func:`read_prompt_pieces`; the probes send these ids again).

``decode`` returns numpy arrays with ``top_ids`` / ``top_logprobs`` as (n, k) matrices padded with -1 / NaN, ``id``
-1 and ``logprob`` NaN where null. Every read opens the file only when it is a regular file (agent/paths.py) and,
given the checksum its result line keeps (``tokens_sha256``), only when its bytes are the ones the line was written
with; a footer whose ``mmcf.top_k`` is absurd, or smaller than the lists it holds, is refused before anything is
allocated. :func:`schema_problems` says how a file's columns differ from this format (``agent.rundir check``).
"""
from __future__ import annotations

import hashlib
import io

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..backends.pieces import pack_pieces, unpack_pieces
from ..jsonio import scrub
from ..paths import open_regular, read_regular
from ..redact import redact_token_texts

__all__ = ["encode", "decode", "FORMAT", "UNLOAD_COLUMNS", "MAX_TOP_K", "token_table", "read_parquet",
           "read_prompt_pieces", "read_schema", "read_footer", "read_sidecar", "verify_file", "schema_problems", "sidecar_bytes", "sha256_of", "write_table"]

FORMAT = b"3"
#: Optional per-token columns of the adaptive image unloading (agent/methods/unload.py).
UNLOAD_COLUMNS = ("unload_kl", "unload_dH")
_META_FORMAT = b"mmcf.sidecar"
_META_K = b"mmcf.top_k"
_META_PRECISION = b"mmcf.precision"
_META_PIECES = b"mmcf.prompt_pieces"
_META_TOKENIZER = b"mmcf.tokenizer"
#: The most alternatives a sidecar may hold per token (ours: SGLang serves far fewer; the bound keeps a damaged or
#: crafted footer from asking a reader to allocate terabytes).
MAX_TOP_K = 1024
#: Byte-stream split, then zstd (level 3): the numeric columns' bytes grouped by significance compress best
#: (docs/performance.md). Not the chosen ``id``s: their low bytes side by side would spell
#: the text wherever ids follow characters (a byte-level tokenizer), a secret a model echoed included.
_SPLIT = ("logprob", "top_ids.list.element", "top_logprobs.list.element", "exact_entropy", *UNLOAD_COLUMNS)
_ZSTD_LEVEL = 3


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sidecar_bytes(path, sha256: str | None = None) -> bytes:
    """The bytes of a sidecar, a regular file (agent/paths.py), refused (ValueError) when ``sha256`` is given and
    they are not the bytes its line was written with (another line's sidecar put in its place, a damaged file)."""
    data = read_regular(path)
    if sha256 is not None and sha256_of(data) != sha256:
        raise ValueError(f"its bytes are not the ones its line was written with (sha256 {sha256_of(data)[:12]}…, "
                         f"the line says {sha256[:12]}…): replaced or damaged")
    return data


def verify_file(path, sha256: str | None) -> None:
    """Refuse (ValueError) a sidecar whose bytes are not the ones its line was written with, reading it in chunks
    (a lazy scan's check: nothing held); a regular file only (agent/paths.py)."""
    if sha256 is None:
        return
    h = hashlib.sha256()
    with open_regular(path) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    if h.hexdigest() != sha256:
        raise ValueError(f"its bytes are not the ones its line was written with (sha256 {h.hexdigest()[:12]}…, "
                         f"the line says {sha256[:12]}…): replaced or damaged")


def _file(path, sha256: str | None = None) -> pq.ParquetFile:
    return pq.ParquetFile(pa.BufferReader(sidecar_bytes(path, sha256)))


def read_parquet(path, columns: list[str] | None = None, *, sha256: str | None = None) -> pa.Table:
    """A Parquet file as an Arrow table (``columns`` to read only some), single-threaded: pyarrow's threaded reader
    intermittently aborts the interpreter at exit (apache/arrow#34314; seen with 26.0.1)."""
    return _file(path, sha256).read(columns=columns, use_threads=False)


def read_sidecar(path, columns: list[str] | None = None, *, sha256: str | None = None, filters=None) -> pa.Table:
    """A run's token sidecar as an Arrow table, its bytes and its schema checked first (ValueError naming what is
    wrong); ``columns`` and pyarrow's row ``filters`` to read only some."""
    data = sidecar_bytes(path, sha256)
    pf = pq.ParquetFile(pa.BufferReader(data))
    bad = schema_problems(pf.schema_arrow)
    if bad:
        raise ValueError("; ".join(bad[:3]))
    if filters is None:
        return pf.read(columns=columns, use_threads=False)
    return pq.read_table(pa.BufferReader(data), columns=columns, filters=filters, use_threads=False)


def read_footer(path) -> pq.FileMetaData:
    """A sidecar's footer (rows, row groups, key-value metadata), read from the end of the file only."""
    with open_regular(path) as f:
        return pq.read_metadata(f)


def read_schema(path) -> pa.Schema:
    """A sidecar's schema with its key-value metadata (its footer)."""
    return _file(path).schema_arrow


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


def _lists(matrix: np.ndarray, present: np.ndarray, typ) -> pa.Array:
    """Each row's present values (a row's alternatives are its leading entries) as a list; null where none."""
    counts = present.sum(axis=1)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    values = pa.array(matrix[present], typ)
    return pa.ListArray.from_arrays(pa.array(offsets), values, mask=pa.array(counts == 0))


def token_table(tokens: dict[int, dict[str, np.ndarray]], k: int, precision: str = "float32") -> pa.Table:
    """The Arrow table (format 3) of a line's per-call token arrays (``{call: {name: array}}``)."""

    calls = sorted(tokens)
    k = max(int(k), 1)
    lens = [len(tokens[c]["id"]) for c in calls]
    call_col = np.repeat(np.asarray(calls, dtype=np.int16), lens) if calls else np.zeros(0, np.int16)
    pos_col = np.concatenate([np.arange(m, dtype=np.int32) for m in lens]) if calls else np.zeros(0, np.int32)
    ids = _cat(tokens, calls, "id", np.int32, -1)
    lps = _cat(tokens, calls, "logprob", np.float32, np.nan)
    top_ids = _stack(tokens, calls, "top_ids", k, np.int32, -1)
    top_lps = _stack(tokens, calls, "top_logprobs", k, np.float32, np.nan)
    if precision == "float16":
        top_lps = top_lps.astype(np.float16).astype(np.float32)
    texts: list = []
    for c in calls:
        t = tokens[c].get("text")
        texts += list(t) if t is not None else [None] * len(tokens[c]["id"])

    def nullable(a):
        return pa.array(a, mask=np.isnan(a) if a.dtype.kind == "f" else a < 0)

    cols = {
        "call": call_col, "pos": pos_col, "id": nullable(ids),
        "text": pa.array(redact_token_texts(_scrubbed(texts, scrub)), pa.string()),
        "logprob": nullable(lps), "think": _cat(tokens, calls, "think", bool, False),
        "top_ids": _lists(top_ids, top_ids >= 0, pa.int32()),
        "top_logprobs": _lists(top_lps, ~np.isnan(top_lps), pa.float32()),
        "exact_entropy": nullable(_cat(tokens, calls, "exact_entropy", np.float32, np.nan)),
    }
    for name in UNLOAD_COLUMNS:  # --image-unload adaptive: per-token KL / ΔH of each probed step
        if calls and any(name in tokens[c] for c in calls):
            cols[name] = nullable(_cat(tokens, calls, name, np.float32, np.nan))
    return pa.table(cols).replace_schema_metadata(
        {_META_FORMAT: FORMAT, _META_K: str(k).encode(), _META_PRECISION: precision.encode()})


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
    """The sidecar file's bytes (plain Parquet, zstd); ``prompt``: (tokenizer fingerprint, {digest: ids}), the
    line's prompt pieces (agent/backends/pieces.py), kept in the file's key-value metadata."""

    return write_table(token_table(tokens, k, precision), prompt)


def write_table(t: pa.Table, prompt: tuple[str, dict] | None = None) -> bytes:
    """A format-3 table's Parquet bytes, with the line's prompt pieces when given."""
    split = [c for c in _SPLIT if c.split(".")[0] in t.column_names]
    buf = io.BytesIO()
    with pq.ParquetWriter(buf, t.schema, compression="zstd", compression_level=_ZSTD_LEVEL,
                          use_byte_stream_split=split, use_dictionary=["text"]) as w:
        w.write_table(t)
        if prompt and prompt[0] and prompt[1]:
            # the file's key-value metadata only: the table schema's metadata is also stored inside the serialised
            # Arrow schema, base64-encoded, which would keep these bytes twice
            w.add_key_value_metadata({_META_TOKENIZER: str(prompt[0]).encode(), _META_PIECES: pack_pieces(prompt[1])})
    return buf.getvalue()


def read_prompt_pieces(path) -> tuple[str | None, dict[bytes, np.ndarray]]:
    """(tokenizer fingerprint, {digest: int32 ids}) of a sidecar's prompt pieces; ``(None, {})`` for a sidecar
    without them (an older run, a backend that sent text). Reads the file's footer only. A malformed record raises
    ValueError."""

    meta = _file(path).metadata.metadata or {}
    blob = meta.get(_META_PIECES)
    if blob is None:
        return None, {}

    fingerprint = meta.get(_META_TOKENIZER, b"").decode("ascii", "replace") or None
    if fingerprint is None:
        raise ValueError("prompt pieces without the fingerprint of their tokenizer")
    return fingerprint, unpack_pieces(blob)


#: Every format-3 column, its type, and whether every sidecar has it.
COLUMNS = {"call": (pa.int16(), True), "pos": (pa.int32(), True), "id": (pa.int32(), True),
           "text": (pa.string(), True), "logprob": (pa.float32(), True), "think": (pa.bool_(), True),
           "top_ids": (pa.list_(pa.int32()), True), "top_logprobs": (pa.list_(pa.float32()), True),
           "exact_entropy": (pa.float32(), True), **{c: (pa.float32(), False) for c in UNLOAD_COLUMNS}}


def schema_problems(schema: pa.Schema) -> list[str]:
    """How a file's schema differs from a format-3 sidecar's (empty: it is one)."""
    meta = schema.metadata or {}
    out = [] if meta.get(_META_FORMAT) == FORMAT else [f"not a format-{FORMAT.decode()} sidecar "
                                                         f"(mmcf.sidecar = {meta.get(_META_FORMAT)!r})"]
    for name, (typ, required) in COLUMNS.items():
        i = schema.get_field_index(name)
        if i < 0:
            if required:
                out.append(f"no column {name!r}")
        elif not schema.field(i).type.equals(typ):
            out.append(f"column {name!r} is {schema.field(i).type}, not {typ}")
    out += [f"unknown column {n!r}" for n in schema.names if n not in COLUMNS]
    try:
        top_k(meta)
    except ValueError as e:
        out.append(str(e))
    return out


def top_k(meta: dict, longest: int = 0) -> int:
    """The footer's ``mmcf.top_k``, refused (ValueError) outside 1..:data:`MAX_TOP_K` or below ``longest`` (the most
    alternatives any of the file's positions holds)."""
    raw = meta.get(_META_K, b"20")
    try:
        k = int(raw)
    except ValueError:
        raise ValueError(f"mmcf.top_k is {raw[:20]!r}, not a number") from None
    if not 0 < k <= MAX_TOP_K:
        raise ValueError(f"mmcf.top_k is {k}: outside 1..{MAX_TOP_K}")
    if longest > k:
        raise ValueError(f"mmcf.top_k is {k} but a token holds {longest} alternatives")
    return k


def _padded(col, k: int, dtype, fill) -> np.ndarray:
    """A list column as an (n, k) matrix, each row's values first, then ``fill``."""
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    n = len(col)
    out = np.full((n, k), fill, dtype=dtype)
    counts = col.value_lengths().fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    values = col.flatten().to_numpy(zero_copy_only=False)
    if len(values) == n * k and (counts == k).all():  # every position has its k alternatives: a reshape
        return values.astype(dtype).reshape(n, k)  # a writable copy, as the other paths give
    rows = np.repeat(np.arange(n), counts)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]) if n else np.zeros(0, np.int64)
    out[rows, np.arange(len(values)) - np.repeat(starts, counts)] = values
    return out


def decode(path, columns: list[str] | None = None, *, sha256: str | None = None) -> dict[str, np.ndarray]:
    """The per-token arrays of a sidecar (``columns`` to read only some); ``sha256``: the checksum its line keeps,
    checked first. A file that is not a format-3 sidecar raises ValueError naming what is wrong."""
    pf = _file(path, sha256)
    schema = pf.schema_arrow  # built on each access: once
    bad = schema_problems(schema)
    if bad:
        raise ValueError("; ".join(bad[:3]))
    want = list(columns) if columns is not None else list(schema.names)
    missing = [c for c in want if c not in schema.names]
    if missing:
        raise ValueError(f"no column(s) {missing} in this sidecar")
    t = pf.read(columns=want, use_threads=False)
    lists = [t.column(c) for c in ("top_ids", "top_logprobs") if c in t.column_names]
    longest = max((int(pc.max(c.combine_chunks().value_lengths()).as_py() or 0) for c in lists), default=0)
    k = top_k(schema.metadata or {}, longest)
    out = {}
    for name in t.column_names:
        col = t.column(name)
        if name in ("top_ids", "top_logprobs"):
            out[name] = _padded(col, k, np.int32, -1) if name == "top_ids" else _padded(col, k, np.float32, np.nan)
        elif name == "id":
            out[name] = col.fill_null(-1).to_numpy(zero_copy_only=False)
        elif col.type in (pa.float32(), pa.float64()):
            out[name] = col.fill_null(np.nan).to_numpy(zero_copy_only=False)
        elif name == "text":
            out[name] = np.array(col.to_pylist(), dtype=object)
        else:
            out[name] = col.to_numpy(zero_copy_only=False)
    return out
