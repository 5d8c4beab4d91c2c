"""The teacher-forced entropy probe's per-token results: one Parquet file per probed trajectory, for the viewer.

    tokens/<key>.parquet             step, pos, dH, kl, and the top-5 alternatives under both contexts (w_/o_ ids
                                     and logprobs; their texts in the schema metadata ``alt_texts``)
    tokens/<key>.partial/s0001.parquet   while the trajectory is probed: each finished step's tokens, one file each,
                                     written whole (temporary name, renamed), before the step's row reaches
                                     steps.jsonl; folded into ``<key>.parquet`` when the trajectory is done

The run's own journal follows the same pattern (agent/run/journal.py: one file per finished call). A probe that
starts folds in the partial directories an interrupted one left (:meth:`TokenStore.recover`), so every step with a
row has its tokens and nothing is scored twice. Every file is plain Parquet (one row per think token: the
:class:`agent.record.TeacherForcedToken` model); :func:`read_step_tokens` is the one reader.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from agent.jsonio import dumps
from agent.rundir import read_parquet
from agent.rundir.common import atomic_write

__all__ = ["TokenStore", "read_step_tokens", "ALTERNATIVES", "PARTIAL"]

#: Alternatives kept per think token and context for the viewer's hover (teacher-forced probe; ours).
ALTERNATIVES = 5
#: The suffix of a trajectory's directory of finished steps while it is probed.
PARTIAL = ".partial"
_LISTS = (("w_ids", np.int32), ("w_lp", np.float32), ("o_ids", np.int32), ("o_lp", np.float32))


def _table_bytes(steps: dict[int, dict], compression: str = "zstd") -> bytes:
    """Steps' token results (``{step: {pos, dH, kl, w_ids, w_lp, o_ids, o_lp, texts}}``) as one Parquet file."""
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
    if texts:  # the alternatives' texts, once per id, in the file's metadata
        table = table.replace_schema_metadata({"alt_texts": dumps(texts, int_keys=True)})
    sink = pa.BufferOutputStream()
    # only the step column dictionary-encoded, no statistics: nothing filters these files by value (ours)
    pq.write_table(table, sink, compression=compression, use_dictionary=["step"], write_statistics=False)
    return sink.getvalue().to_pybytes()


def _steps_of(path: Path) -> dict[int, dict]:
    """``{step: {pos, dH, kl, w_*, o_*, texts}}`` of one file of this store."""
    t = read_parquet(path)
    step = t.column("step").to_numpy()
    cols = {c: t.column(c).to_numpy() for c in ("pos", "dH", "kl")}
    for c, _ in _LISTS:
        if c in t.column_names:
            cols[c] = np.asarray(t.column(c).combine_chunks().flatten()).reshape(-1, ALTERNATIVES)
    meta = (t.schema.metadata or {}).get(b"alt_texts")
    texts = {int(k): v for k, v in json.loads(meta).items()} if meta else {}
    return {int(s): {**{c: v[step == s] for c, v in cols.items()}, "texts": texts} for s in np.unique(step)}


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
        """One finished step's tokens, whole, into the trajectory's partial directory (uncompressed: it is read once,
        when the trajectory is done)."""
        d = self.partial(key)
        d.mkdir(parents=True, exist_ok=True)
        atomic_write(d / f"s{int(step):04d}.parquet", _table_bytes({step: tok}, compression="none"))

    def commit(self, key: str, steps: dict[int, dict]) -> None:
        """The trajectory's steps into its file, with those an earlier session kept there and in its partial
        directory (a recovery), then the partial directory removed."""
        merged = _steps_of(self.path(key)) if self.path(key).exists() else {}
        part = self.partial(key)
        for p in sorted(part.glob("s*.parquet")) if part.is_dir() else []:
            merged.update(_steps_of(p))
        merged.update(steps)
        if merged:
            self.d.mkdir(parents=True, exist_ok=True)
            atomic_write(self.path(key), _table_bytes(merged))
        shutil.rmtree(part, ignore_errors=True)

    def recover(self) -> int:
        """Fold the partial directories an interrupted probe left into their trajectories' files; how many."""
        keys = sorted(p.name[: -len(PARTIAL)] for p in self.d.glob(f"*{PARTIAL}") if p.is_dir()) \
            if self.d.is_dir() else []
        for key in keys:
            self.commit(key, {})
        return len(keys)


def read_step_tokens(tokens_dir: Path, key: str) -> dict[int, dict]:
    """``{step: {pos, dH, kl, w_ids, w_lp, o_ids, o_lp, texts}}`` of one trajectory from a teacher-forced probe's
    ``tokens/`` (empty when it was not probed)."""
    p = TokenStore(Path(tokens_dir)).path(key)
    return _steps_of(p) if p.exists() else {}
