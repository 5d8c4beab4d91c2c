"""The teacher-forced entropy probe's per-token results: one Parquet file per probed trajectory, for the viewer.

    tokens/<key>.parquet          step, pos, dH, kl, and the top-5 alternatives under both contexts (w_/o_ ids
                                  and logprobs; their texts in the schema metadata ``alt_texts``)
    tokens/<key>.partial.arrows   while the trajectory is probed: each finished step's tokens appended as one
                                  whole Arrow IPC stream (its schema with the step's texts, one batch, the end
                                  marker), flushed before the step's row reaches steps.jsonl; folded into
                                  ``<key>.parquet`` when the trajectory is done

A step's append is one write of its whole stream (ours: an uncompressed Arrow stream costs a tenth of a Parquet file
written and renamed per step, docs/performance.md), flushed like the step's row in steps.jsonl: both survive a
killed probe. A kill mid-write leaves a torn last stream, which the reader stops before; that step has no row yet
and is probed again. A probe that starts folds in the partial files an interrupted one left
(:meth:`TokenStore.recover`), so every step with a row has its tokens and nothing is scored twice. The folded file
is plain Parquet (one row per think token: the :class:`agent.record.TeacherForcedToken` model);
:func:`read_step_tokens` is the one reader.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from agent.errors import writing
from agent.jsonio import dumps, loads
from agent.rundir import read_parquet
from agent.rundir.common import atomic_write
from agent.rundir.probe_outputs import verify_output

__all__ = ["TokenStore", "read_step_tokens", "ALTERNATIVES", "PARTIAL"]

#: Alternatives kept per think token and context for the viewer's hover (teacher-forced probe; ours).
ALTERNATIVES = 5
#: The suffix of a trajectory's file of finished steps while it is probed.
PARTIAL = ".partial.arrows"
_LISTS = (("w_ids", np.int32), ("w_lp", np.float32), ("o_ids", np.int32), ("o_lp", np.float32))
_TEXTS = b"alt_texts"


def _table(steps: dict[int, dict]) -> pa.Table:
    """Steps' token results (``{step: {pos, dH, kl, w_ids, w_lp, o_ids, o_lp, texts}}``) as one table, in step
    order, the alternatives' texts (once per id) in its schema metadata."""
    order = sorted(steps)
    cols = {"step": np.concatenate([np.full(len(steps[s]["pos"]), s, np.int32) for s in order]),
            "pos": np.concatenate([np.asarray(steps[s]["pos"], np.int32) for s in order]),
            "dH": np.concatenate([np.asarray(steps[s]["dH"], np.float32) for s in order]),
            "kl": np.concatenate([np.asarray(steps[s]["kl"], np.float32) for s in order])}
    texts: dict = {}
    if all("w_ids" in steps[s] for s in order):
        for c, dt in _LISTS:
            flat = np.concatenate([np.asarray(steps[s][c], dt).reshape(-1, ALTERNATIVES) for s in order])
            cols[c] = pa.FixedSizeListArray.from_arrays(pa.array(flat.ravel()), ALTERNATIVES)
        for s in order:
            texts.update(steps[s].get("texts") or {})
    table = pa.table(cols)
    return table.replace_schema_metadata({_TEXTS: dumps(texts, int_keys=True)}) if texts else table


def _texts_of(table: pa.Table) -> dict[int, str]:
    return {int(k): v for k, v in _written_texts(table).items()}


def _written_texts(table: pa.Table) -> dict[str, str]:
    """The texts as the metadata holds them (ids as strings): what a merge copies on without converting each id."""
    meta = (table.schema.metadata or {}).get(_TEXTS)
    return loads(meta) if meta else {}


def _parquet_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    # only the step column dictionary-encoded, no statistics: nothing filters these files by value (ours)
    pq.write_table(table, sink, compression="zstd", use_dictionary=["step"], write_statistics=False)
    return sink.getvalue().to_pybytes()


def _stream_bytes(table: pa.Table) -> bytes:
    """``table`` as one whole Arrow IPC stream: schema (with its metadata), its batches, the end marker."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def _streams(path: Path) -> list[pa.Table]:
    """The whole streams of a partial file, in order; a torn last one (a kill mid-append) is left out."""
    data = path.read_bytes()
    buf, out = pa.BufferReader(pa.py_buffer(data)), []
    while buf.tell() < len(data):
        try:
            out.append(pa.ipc.open_stream(buf).read_all())
        except (OSError, pa.ArrowInvalid):
            break
    return out


def _steps_of(table: pa.Table) -> dict[int, dict]:
    """``{step: {pos, dH, kl, w_*, o_*, texts}}`` of one table of this store."""
    step = table.column("step").to_numpy()
    cols = {c: table.column(c).to_numpy() for c in ("pos", "dH", "kl")}
    for c, _ in _LISTS:
        if c in table.column_names:
            cols[c] = np.asarray(table.column(c).combine_chunks().flatten()).reshape(-1, ALTERNATIVES)
    texts = _texts_of(table)
    return {int(s): {**{c: v[step == s] for c, v in cols.items()}, "texts": texts} for s in np.unique(step)}


def _merge(tables: list[pa.Table]) -> pa.Table:
    """One table of these, in step order; a step in more than one keeps its last."""
    steps = np.concatenate([np.unique(t.column("step").to_numpy()) for t in tables])
    if all(t.schema.equals(tables[0].schema, check_metadata=False) for t in tables) and np.all(np.diff(steps) > 0):
        texts: dict = {}  # each step once, in order (a probe's own appends): the tables as they are
        for t in tables:
            texts.update(_written_texts(t))
        out = pa.concat_tables([t.replace_schema_metadata(None) for t in tables])
        return out.replace_schema_metadata({_TEXTS: dumps(texts)}) if texts else out
    merged: dict[int, dict] = {}
    for t in tables:
        merged.update(_steps_of(t))
    return _table(merged)


class TokenStore:
    """The per-token results of one teacher-forced probe (``OUT/tokens/``), one file per trajectory, not one per
    step (50,870 of them at paper scale)."""

    def __init__(self, d: Path):
        self.d = d

    def path(self, key: str) -> Path:
        return self.d / f"{key}.parquet"

    def partial(self, key: str) -> Path:
        return self.d / f"{key}{PARTIAL}"

    def append(self, key: str, step: int, tok: dict) -> None:
        """One finished step's tokens, as one whole stream appended to the trajectory's partial file."""
        self.d.mkdir(parents=True, exist_ok=True)
        data = _stream_bytes(_table({step: tok}))
        with writing(self.partial(key)), open(self.partial(key), "ab") as f:
            f.write(data)

    def commit(self, key: str) -> None:
        """The trajectory's finished steps into its file, with those an earlier session kept there (a rerun over
        steps already folded: a step's latest tokens win), then the partial file removed."""
        part = self.partial(key)
        fresh = _streams(part) if part.exists() else []
        if fresh:
            tables = ([read_parquet(self.path(key))] if self.path(key).exists() else []) + fresh
            atomic_write(self.path(key), _parquet_bytes(_merge(tables)))
        part.unlink(missing_ok=True)

    def recover(self) -> int:
        """Fold the partial files an interrupted probe left into their trajectories' files; how many."""
        keys = sorted(p.name[: -len(PARTIAL)] for p in self.d.glob(f"*{PARTIAL}")) if self.d.is_dir() else []
        for key in keys:
            self.commit(key)
        return len(keys)


def read_step_tokens(tokens_dir: Path, key: str) -> dict[int, dict]:
    """``{step: {pos, dH, kl, w_ids, w_lp, o_ids, o_lp, texts}}`` of one trajectory from a teacher-forced probe's
    ``tokens/`` (empty when it was not probed), read only as its probe sealed it (RunError otherwise:
    agent/rundir/probe_outputs.py ``verify_output``)."""
    p = TokenStore(Path(tokens_dir)).path(key)
    if not p.exists():
        return {}
    verify_output(p)
    return _steps_of(read_parquet(p))
