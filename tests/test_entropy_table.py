"""The entropy probe's end phase (probes/entropy/table.py): its rows read back into the steps table, the forking
columns and the serving totals, one row at a time; what it holds stays a few hundred bytes a step."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from agent.rundir.lines import seal
from analysis.estimators.entropy import FORK_BIN, entropy_histogram, forking_stats, forking_threshold
from probes.entropy import table as T

AGGS = ("mean", "median", "trimmed", "first", "last", "max", "top20_exact", "whole")


def _row(t: int, step: int, rng, *, hot: float = 0.0) -> dict:
    """A teacher-forced step row of trajectory ``t`` whose think tokens' entropies are drawn (``hot`` shifts them)."""
    hw = rng.gamma(2.0, 0.7, 300) + hot
    ho = np.maximum(hw - rng.normal(0.2, 0.3, 300), 0.0)
    return {"sample_id": f"s{t}", "trial": 0, "benchmark": "demo", "paper_category": "Atomic factuality",
            "category": "Atomic factuality", "step": step, "state": "react", "n_images": 1, "n_query_images": 1,
            "n_tokens": 400, "n_think": 300, "mode": "teacher-forced", "semantics": "raw", "model": "m",
            "H_with": float(hw.mean()), "H_without": float(ho.mean()), "kl_with_without": 0.1,
            "fork": {"w": entropy_histogram(hw, hw - ho), "o": entropy_histogram(ho)}, "n_think_without": 300,
            "agg": {a: [float(hw.mean()), float(ho.mean())] for a in AGGS}, "dH": float(hw.mean() - ho.mean()),
            "prompt_tokens": 1000, "cached_tokens": 600, "latency_s": 0.25, "source_sha256": f"{t:064x}"}


def _write(path, rows) -> dict:
    path.write_bytes(b"".join(seal(r) + b"\n" for r in rows))
    return {(r["sample_id"], r["trial"]): r["source_sha256"] for r in rows}


def test_the_table_is_the_rows_forking_columns_by_the_plain_histogram_functions(tmp_path):
    rng = np.random.default_rng(1)
    rows = [_row(t, s, rng) for t in range(6) for s in (1, 2, 3)]
    sources = _write(tmp_path / "steps.jsonl", rows)
    steps, table = T.read_step_table(tmp_path / "steps.jsonl", sources, "teacher-forced")
    assert len(steps) == len(rows) and "fork" not in steps and "agg" not in steps and "line_sha256" not in steps
    j, theta = forking_threshold(r["fork"]["w"] for r in rows)  # the run-wide threshold, over every step
    assert table.threshold() == (j, theta) and theta == pytest.approx(j * FORK_BIN)
    for i, r in enumerate(rows):
        nw, fw, sw, dw = forking_stats(r["fork"]["w"], j)
        no, fo, _, _ = forking_stats(r["fork"]["o"], j)
        got = steps.iloc[i]
        assert got["share_fork_with"] == pytest.approx(fw / nw) and got["share_fork_without"] == pytest.approx(fo / no)
        assert got["dH_fork"] == pytest.approx(dw / nw) and got["dH_rest"] == pytest.approx(r["dH"] - dw / nw)
        assert got["dH_agg_mean"] == pytest.approx(r["agg"]["mean"][0] - r["agg"]["mean"][1])
    per_step = table.forking(steps)
    assert list(per_step["step"]) == [1, 2, 3] and (per_step["threshold_nats"] == theta).all()
    assert per_step["forking_tokens"].sum() == sum(forking_stats(r["fork"]["w"], j)[1] for r in rows)
    assert T.serving(steps) == {"requests": 18, "prompt_tokens": 18000, "cached_tokens": 10800, "cached_share": 0.6,
                                "server_seconds": 4.5}


def test_a_step_written_twice_counts_once_and_its_first_row_moves_no_threshold(tmp_path, caplog):
    """Of duplicates the last row counts, in the table and in the run-wide threshold."""
    rng = np.random.default_rng(2)
    rows = [_row(t, 1, rng) for t in range(5)]
    stale = _row(0, 1, rng, hot=6.0)  # a first attempt at step 1 of s0, far hotter, superseded below
    sources = _write(tmp_path / "steps.jsonl", [stale, *rows])
    steps, table = T.read_step_table(tmp_path / "steps.jsonl", sources, "teacher-forced")
    assert len(steps) == 5 and "duplicate step row(s) ignored" in caplog.text
    assert table.threshold() == forking_threshold(r["fork"]["w"] for r in rows)
    assert steps.loc[steps["sample_id"] == "s0", "H_with"].item() == rows[0]["H_with"]


def test_steps_without_think_tokens_have_no_forking_numbers(tmp_path):
    """Empty histograms (a step whose calls gave no thinking): NaN shares, no threshold, and the table still made."""
    rng = np.random.default_rng(3)
    rows = [{**_row(t, 1, rng), "fork": {"w": {}, "o": {}}} for t in range(3)]
    steps, table = T.read_step_table(tmp_path / "steps.jsonl", _write(tmp_path / "steps.jsonl", rows),
                                     "teacher-forced")
    assert len(steps) == 3 and steps[["share_fork_with", "share_fork_without", "dH_fork"]].isna().all().all()
    per_step = table.forking(steps)
    assert per_step["forking_tokens"].tolist() == [0] and np.isnan(per_step["threshold_nats"]).all()


def test_the_end_phase_holds_a_few_hundred_bytes_a_step(tmp_path, monkeypatch):
    """Python's own count of what the read allocates (tracemalloc: numpy's arrays and pandas' frames included),
    not the process's memory: each row was a ~4 KB dict before, and the whole file besides; now the rows pass
    through and the frame stays. (The per-step bootstrap after it allocates by its own sample sizes.)"""
    monkeypatch.setattr(T, "CHUNK", 256)
    rng = np.random.default_rng(4)
    rows = [_row(t, s, rng) for t in range(300) for s in range(1, 11)]
    sources = _write(tmp_path / "steps.jsonl", rows)
    T.read_step_table(tmp_path / "steps.jsonl", sources, "teacher-forced")  # first use: imports, caches
    tracemalloc.start()
    try:
        steps, table = T.read_step_table(tmp_path / "steps.jsonl", sources, "teacher-forced")
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    per_row_file = (tmp_path / "steps.jsonl").stat().st_size / len(rows)
    assert per_row_file > 1500  # rows the size of a real probe's (histograms of ~60 bins a side)
    assert peak / len(rows) < 1500 and held / len(rows) < 1000, (peak / len(rows), held / len(rows))
