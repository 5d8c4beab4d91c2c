"""The entropy probe's per-token store: each trajectory's think tokens (ΔH, KL, alternatives) for the viewer.

A step's tokens are appended to the trajectory's partial file as it finishes (a framed binary record, so an
interrupt keeps every finished step); when the trajectory is done they are folded into ``tokens/<key>.parquet``.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from agent.http import dumps, loads
from agent.rundir import read_parquet
from agent.rundir.common import atomic_write

_COLUMNS = ("pos", "dH", "kl", "w_ids", "w_lp", "o_ids", "o_lp")


#: Alternatives kept per think token and context for the viewer's hover (teacher-forced probe; ours).
ALTERNATIVES = 5



class TokenStore:
    """The teacher-forced probe's per-token results, one ``tokens/<key>.parquet`` per trajectory (columns step, pos,
    dH, kl), not one file per step (50,870 of them at paper scale; 1.1 ms of CPU each; ours).

    While a trajectory is probed, each finished step is appended to ``tokens/<key>.partial.bin`` (one flushed
    binary record, before the step's row reaches steps.jsonl), so an interrupt keeps every finished step's tokens;
    when the trajectory is done its steps go into the Parquet file (merged with the steps an earlier session kept)
    and the partial file is removed. A probe that starts finds the partial files an interrupted one left (and an
    older probe's ``.partial.jsonl``) and folds them in first (:meth:`recover`). At most one partial file per
    trajectory in flight exists at a time."""

    def __init__(self, d: Path):
        self.d = d

    def path(self, key: str) -> Path:
        return self.d / f"{key}.parquet"

    def append(self, key: str, step: int, tok: dict, fh=None):
        """One step's arrays onto the trajectory's partial file (``fh``: its open handle, returned): one framed
        binary record, flushed (:func:`_frame`; ours: the arrays' bytes as they are, ~0.05 ms a step, where the
        same record as a JSON line cost ~0.6 ms)."""
        if fh is None:
            self.d.mkdir(parents=True, exist_ok=True)
            fh = open(self.d / f"{key}{PARTIAL}", "ab")
        fh.write(_frame(step, tok))
        fh.flush()
        return fh

    def commit(self, key: str, steps: dict[int, dict], *, partial_too: bool = False) -> None:
        """Write the trajectory's steps (with the ones already in its file, and with ``partial_too`` those in its
        partial file: a recovery; a probe's own partial file holds just ``steps``), then drop the partial file."""


        partials = [self.d / f"{key}{PARTIAL}", self.d / f"{key}{_PARTIAL_JSONL}"]
        merged = self._read(key)
        if partial_too:
            for partial in partials[::-1]:  # an older probe's JSON lines first, then this format's records
                merged.update(self._read_partial(partial))
        merged.update(steps)
        if merged:
            order = sorted(merged)
            cols = {"step": np.concatenate([np.full(len(merged[s]["pos"]), s, np.int32) for s in order]),
                    "pos": np.concatenate([np.asarray(merged[s]["pos"], np.int32) for s in order]),
                    "dH": np.concatenate([np.asarray(merged[s]["dH"], np.float32) for s in order]),
                    "kl": np.concatenate([np.asarray(merged[s]["kl"], np.float32) for s in order])}
            texts = {}
            if all("w_ids" in merged[s] for s in order):  # the alternatives (probes from before: none)
                for c, dt in (("w_ids", np.int32), ("w_lp", np.float32), ("o_ids", np.int32), ("o_lp", np.float32)):
                    flat = np.concatenate([np.asarray(merged[s][c], dt).reshape(-1, ALTERNATIVES) for s in order])
                    cols[c] = pa.FixedSizeListArray.from_arrays(pa.array(flat.ravel()), ALTERNATIVES)
                for s in order:  # int keys throughout (the readers below convert theirs)
                    texts.update(merged[s].get("texts") or {})
            table = pa.table(cols)
            if texts:  # the alternatives' texts, once per id, in the file's metadata
                table = table.replace_schema_metadata({"alt_texts": dumps(texts, int_keys=True)})
            sink = pa.BufferOutputStream()
            # dictionary-encoding only the step column: with every column dictionary-encoded (pyarrow's default) the
            # write took ~4x the CPU and the file was larger (ours, ad hoc: 9.8 -> 2.2 ms and 1.02 -> 0.65 MB for a
            # 9,000-token trajectory)
            # (no column statistics: nothing filters these files by value; ~7 % of the write)
            pq.write_table(table, sink, compression="zstd", use_dictionary=["step"], write_statistics=False)
            self.d.mkdir(parents=True, exist_ok=True)
            atomic_write(self.path(key), sink.getvalue().to_pybytes())
        for partial in partials:
            partial.unlink(missing_ok=True)

    def recover(self) -> int:
        """Fold the partial files an interrupted probe left into their trajectories' files; returns how many."""
        n = 0
        keys = sorted({p.name[: -len(suffix)] for suffix in (PARTIAL, _PARTIAL_JSONL)
                       for p in (self.d.glob(f"*{suffix}") if self.d.is_dir() else [])})
        for key in keys:
            self.commit(key, {}, partial_too=True)
            n += 1
        return n

    def _read(self, key: str) -> dict:
        p = self.path(key)
        if not p.exists():
            return {}

        t = read_parquet(p)
        step = t.column("step").to_numpy()
        cols = {c: t.column(c).to_numpy() for c in ("pos", "dH", "kl")}
        for c in ("w_ids", "w_lp", "o_ids", "o_lp"):
            if c in t.column_names:
                cols[c] = np.asarray(t.column(c).combine_chunks().flatten()).reshape(-1, ALTERNATIVES)
        meta = (t.schema.metadata or {}).get(b"alt_texts")
        texts = {int(k): v for k, v in json.loads(meta).items()} if meta else {}
        return {int(s): {**{c: v[step == s] for c, v in cols.items()}, "texts": texts} for s in np.unique(step)}

    @staticmethod
    def _read_partial(p: Path) -> dict:
        out = {}
        if not p.exists():
            return out
        data = p.read_bytes()
        if p.name.endswith(_PARTIAL_JSONL):  # a probe from before the binary records
            for raw in data.splitlines():
                try:
                    r = loads(raw)
                    out[int(r["step"])] = {**{c: r[c] for c in _COLUMNS if c in r},
                                           "texts": {int(k): v for k, v in (r.get("texts") or {}).items()}}
                except (ValueError, KeyError, TypeError):  # a torn last line: that step's row was never written
                    continue
            return out
        at = 0
        while at < len(data):
            got = _unframe(data, at)
            if got is None:  # a torn last record (an interrupted write): that step's row was never written
                print(f"{p}: a torn record at byte {at} ignored (its step is probed again)", file=sys.stderr)
                break
            at, step, rec = got
            out[step] = rec
        return out


#: A trajectory's partial token results: framed binary records (:func:`_frame`); ``.partial.jsonl`` is the format
#: of probes from before, still folded in.
PARTIAL = ".partial.bin"


_PARTIAL_JSONL = ".partial.jsonl"


_MAGIC = b"MMTS"


def _frame(step: int, tok: dict) -> bytes:
    """One step's token results as a record: magic, the header's length (uint32 LE), the header (JSON: step, each
    column's dtype and shape, the alternatives' texts) and the columns' bytes in header order (ours)."""
    arrays = [(c, np.ascontiguousarray(tok[c])) for c in _COLUMNS if c in tok]
    head = dumps({"step": int(step), "cols": [[c, a.dtype.str, list(a.shape)] for c, a in arrays],
                  "texts": tok.get("texts") or {}}, int_keys=True)
    return b"".join([_MAGIC, len(head).to_bytes(4, "little"), head, *(a.tobytes() for _, a in arrays)])


def _unframe(data: bytes, at: int):
    """(next offset, step, {column: array, "texts": {id: text}}) of the record at ``at``; None if it is torn."""
    if data[at:at + 4] != _MAGIC or len(data) < at + 8:
        return None
    n = int.from_bytes(data[at + 4:at + 8], "little")
    try:
        head = loads(data[at + 8:at + 8 + n])
        at += 8 + n
        rec = {}
        for c, dt, shape in head["cols"]:
            a = np.frombuffer(data, dtype=np.dtype(dt), count=int(np.prod(shape, dtype=np.int64)), offset=at)
            rec[c] = a.reshape(shape)
            at += a.nbytes
        rec["texts"] = {int(k): v for k, v in head["texts"].items()}
        return at, int(head["step"]), rec
    except (ValueError, KeyError, TypeError):
        return None


def read_step_tokens(tokens_dir: Path, key: str) -> dict[int, dict]:
    """{step: {"pos", "dH", "kl"}} of one trajectory from a teacher-forced probe's ``tokens/`` (the per-trajectory
    file; a probe from before it wrote ``<key>__c<step>.parquet`` per step, read too)."""
    out = TokenStore(tokens_dir)._read(key)
    if not out:
        for p in tokens_dir.glob(f"{key}__c*.parquet"):
            try:
                step = int(p.stem.rsplit("__c", 1)[1])
            except ValueError:
                continue
            t = read_parquet(p)
            out[step] = {c: t.column(c).to_numpy() for c in ("pos", "dH", "kl")}
    return out
