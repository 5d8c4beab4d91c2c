"""The entropy probe's rows read back into its tables (the probe's end phase), one row at a time and twice: the
first pass keeps each row's scalars (columns, a chunk of rows at a time) and adds its with-images histogram to the
run's, which sets the forking threshold; the second computes each row's forking sums at that threshold. No row is
held as a dict and no histogram is kept, so what the end phase holds grows by a few hundred bytes a step, not by
each row (ours; docs/performance.md). Then the forking tokens' part of ΔH per step (ours) and the serving totals.
"""
from __future__ import annotations

import logging
import sys
from array import array
from pathlib import Path

import numpy as np

from agent.lazy import lazy_module
from agent.record import EntropyStep
from agent.rundir import RunError
from agent.rundir.lines import SEAL_KEY, SOURCE_KEY, SealedRows
from agent.rundir.probe_outputs import iter_rows
from analysis.estimators.entropy import FORK_BINS, forking_stats, forking_threshold
from analysis.estimators.stats import summarise_by

pd = lazy_module("pandas")
log = logging.getLogger(__name__)

__all__ = ["StepTable", "read_step_table", "serving"]

#: Rows gathered as dicts before they become a DataFrame chunk.
CHUNK = 4096
#: Per row, from :func:`analysis.estimators.entropy.forking_stats` of each side: think tokens, forking tokens, their summed
#: entropy (both sides), and their summed dH (the with side of a teacher-forced probe).
#: What a row's scalar columns leave out: its histograms and aggregations (columns of their own) and its seal.
_NOT_SCALAR = {"fork", "agg", SEAL_KEY}
_SUMS = ("n_with", "fork_with", "sum_with", "dsum_with", "n_without", "fork_without", "sum_without")


class StepTable:
    """:meth:`add` each row, then :meth:`add_forking` each row again in the same order, then :meth:`frame` and
    :meth:`forking`."""

    def __init__(self, mode: str):
        self.mode = mode
        self.chunks: list = []        # DataFrames of each chunk's scalar columns
        self.aggs: list = []          # and of its aggregations' columns
        self.pending: list[dict] = []
        self.pending_agg: list[dict] = []
        self.order: list[tuple] = []  # each position's (sample_id, trial, step)
        self.last: dict = {}          # (sample_id, trial, step) -> the position of its last row
        self.forked = array("b")      # per position: the row carries forking histograms
        self.total = np.zeros(FORK_BINS)  # the with-images histogram of the rows read
        self.sums: np.ndarray | None = None
        self.n_fork = None            # per row of frame(): its forking tokens (NaN without histograms)

    def add(self, row: EntropyStep) -> None:
        key = (row.sample_id, row.trial, row.step)
        self.last[key] = len(self.order)  # of duplicates the last counts
        self.order.append(key)
        self.forked.append(isinstance(row.fork, dict))
        self._count(row.fork)
        self.pending_agg.append(_agg_columns(row.agg))
        # the fields the row holds (none its model adds), in the record's order (one order for both modes); a run's labels repeat on every row (its benchmark, a
        # trajectory's id and source): one object each
        scalars = row.model_dump(exclude_unset=True, exclude=_NOT_SCALAR)
        scalars[SOURCE_KEY] = scalars.pop(SOURCE_KEY, None)  # the record's own fields first, then its source
        self.pending.append({k: sys.intern(v) if type(v) is str else v for k, v in scalars.items()})
        if len(self.pending) >= CHUNK:
            self._flush()

    def _flush(self) -> None:
        if self.pending:
            self.chunks.append(pd.DataFrame(self.pending))
            self.aggs.append(pd.DataFrame(self.pending_agg, index=range(len(self.pending_agg))))
            self.pending, self.pending_agg = [], []

    def _count(self, fork) -> None:
        w = fork.get("w") if isinstance(fork, dict) else None
        if w:
            np.add.at(self.total, np.asarray(w["bin"], dtype=np.int64), np.asarray(w["n"], dtype=np.float64))

    def recount(self, rows) -> None:
        """The with-images histogram again over the last row of each step only (``rows``: the rows again, in order):
        what :meth:`threshold` counts when a step's row was written twice."""
        self.total[:] = 0
        kept = self._kept()
        for i, row in enumerate(rows):
            if kept[i]:
                self._count(row.fork)

    def threshold(self) -> tuple[int, float]:
        """The run-wide forking threshold (bin, nats) over the rows with histograms that count (the last of each
        step): arXiv 2506.01939's high-entropy minority, the run's top 20 % of think tokens by entropy with the
        images (:func:`analysis.estimators.entropy.forking_threshold`)."""
        return forking_threshold([{"bin": np.arange(FORK_BINS), "n": self.total}])

    def add_forking(self, i: int, row: EntropyStep, j: int) -> None:
        """The ``i``-th row again: its forking sums at the threshold bin ``j``."""
        if i >= len(self.order) or self.order[i] != (row.sample_id, row.trial, row.step):
            raise RunError(f"row {i + 1} of the probe's rows changed while they were read; run the command again")
        if self.sums is None:
            self.sums = np.full((len(self.order), len(_SUMS)), np.nan)
        fork = row.fork
        if isinstance(fork, dict):
            nw, fw, sw, dw = forking_stats(fork.get("w"), j)
            no, fo, so, _ = forking_stats(fork.get("o"), j)
            self.sums[i] = (nw, fw, sw, dw, no, fo, so)

    def _kept(self) -> np.ndarray:
        keep = np.zeros(len(self.order), dtype=bool)
        keep[list(self.last.values())] = True
        return keep

    def frame(self) -> "pd.DataFrame":
        """One row per step (the last of duplicates): its scalars, the forking columns (when any row has
        histograms) and the aggregations' columns."""
        self._flush()
        if not self.order:
            return pd.DataFrame()
        parts = [pd.concat(self.chunks, ignore_index=True, sort=False)]
        if self.sums is not None and np.frombuffer(self.forked, dtype=np.int8).any():
            parts.append(self._forking_columns(parts[0]))
        parts.append(pd.concat(self.aggs, ignore_index=True, sort=False))
        steps = pd.concat(parts, axis=1)[self._kept()].reset_index(drop=True)
        self.n_fork = steps.pop("n_fork") if "n_fork" in steps else None
        return steps

    def _forking_columns(self, scalars) -> "pd.DataFrame":
        """Per row: the shares of forking think tokens with and without the images, the forking tokens' part of ΔH
        (``dH_fork``; ΔH = dH_fork + dH_rest, both per think token of the step; teacher-forced: Σ over the tokens
        that fork with the images of their H with − without, / n; regenerate: each response's own forking tokens,
        Σ H / n with − the same without) and ``n_fork``; NaN on rows without histograms."""
        assert self.sums is not None
        nw, fw, sw, dw, no, fo, so = self.sums.T
        with np.errstate(divide="ignore", invalid="ignore"):
            d = dw / nw if self.mode == "teacher-forced" else sw / nw - so / no
            d = np.where((nw > 0) & (no > 0), d, np.nan)
            dh = pd.to_numeric(scalars["dH"], errors="coerce").to_numpy(float) if "dH" in scalars else np.nan
            return pd.DataFrame({"share_fork_with": np.where(nw > 0, fw / nw, np.nan),
                                 "share_fork_without": np.where(no > 0, fo / no, np.nan),
                                 "dH_fork": d, "dH_rest": dh - d, "n_fork": fw})

    def forking(self, steps: "pd.DataFrame"):
        """``steps``: :meth:`frame`'s, in its order. Per step over its rows with histograms: the forking shares with and without the images,
        ``dH_fork`` with a bootstrap CI, ``dH_rest``, the forking tokens, the threshold. None without histograms."""
        if self.n_fork is None:
            return None
        df = steps.assign(n_fork=self.n_fork)[self.n_fork.notna()]
        out = summarise_by(df[np.isfinite(df["dH_fork"])], "step", "dH_fork")
        if out.empty:  # no step has forking tokens on both sides: the shares still say where they are
            out = pd.DataFrame(columns=["step", "n", "mean", "ci_low", "ci_high", "wilcoxon_p"])
        out = out.rename(columns={"mean": "dH_fork", "ci_low": "fork_ci_low", "ci_high": "fork_ci_high",
                                  "n": "n_steps"})
        shares = df.groupby("step").agg(share_fork_with=("share_fork_with", "mean"),
                                        share_fork_without=("share_fork_without", "mean"),
                                        dH_rest=("dH_rest", "mean"), forking_tokens=("n_fork", "sum")).reset_index()
        shares["forking_tokens"] = shares["forking_tokens"].astype("int64")
        out = shares.merge(out, on="step", how="left")
        out["threshold_nats"] = self.threshold()[1]
        return out


def serving(steps: "pd.DataFrame") -> dict:
    """Over every step row: requests, prompt tokens, those the server's prefix cache served (SGLang's
    ``cached_tokens``), and the summed request time (``server_seconds``: request-seconds, batched requests
    overlapping; the GPU-seconds held are probe.json's ``cost``, :func:`probes.session.record_session`)."""
    rs = steps[steps["prompt_tokens"].notna()] if "prompt_tokens" in steps else steps.iloc[:0]

    def total(col, kind):
        return rs[col].fillna(0).astype(kind).sum() if col in rs and len(rs) else kind(0)
    prompt, cached = int(total("prompt_tokens", int)), int(total("cached_tokens", int))
    return {"requests": len(rs), "prompt_tokens": prompt, "cached_tokens": cached,
            "cached_share": round(cached / prompt, 4) if prompt else None,
            "server_seconds": round(float(total("latency_s", float)), 2)}


def _agg_columns(agg) -> dict:
    """A row's ΔH under each aggregation of its tokens' entropies (``dH_agg_<name>``: with - without; NaN where a
    side is undefined), for the robustness analysis (analysis/robustness.py)."""
    out = {}
    for name, pair in (agg or {}).items():
        w, o = pair if isinstance(pair, list) and len(pair) == 2 else (None, None)
        out[f"dH_agg_{name}"] = float(w) - float(o) if w is not None and o is not None else float("nan")
    return out


def read_step_table(steps_path: Path, sources: dict, mode: str) -> tuple["pd.DataFrame", StepTable]:
    """``steps.jsonl``'s rows of the run's lines as one frame (torn and changed lines left out; of duplicates the
    last counts, said so), and the table that read them (:meth:`StepTable.forking`)."""
    table = StepTable(mode)
    for row in iter_rows(SealedRows(Path(steps_path)), EntropyStep, sources):
        table.add(row)
    if len(table.last) < len(table.order):
        log.warning(f"{steps_path}: {len(table.order) - len(table.last)} duplicate step row(s) ignored (the last "
                    "of each is kept)")
    if np.frombuffer(table.forked, dtype=np.int8).any():
        if len(table.last) < len(table.order):
            table.recount(iter_rows(SealedRows(Path(steps_path)), EntropyStep, sources))
        j = table.threshold()[0]
        for i, row in enumerate(iter_rows(SealedRows(Path(steps_path)), EntropyStep, sources)):
            table.add_forking(i, row, j)
    return table.frame(), table
