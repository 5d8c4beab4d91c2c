"""Runs and the probes' outputs as tidy pandas DataFrames (docs/frames.md): the one reading path of the tables
and the figures.

    from analysis import frames
    frames.results(RUN)     frames.steps(RUN)     frames.tokens(RUN)     frames.grades(RUN)   # agent/rundir/frames.py
    frames.entropy(RUN)     # Figure 2(b): one row per probed step (probes/entropy)
    frames.removal(RUN)     # Figure 2(c): one row per (trajectory, k) replay (probes/removal/)
    frames.grounding(RUN)   # Figure 2(a): one row per labelled step (probes/grounding/)

The probe readers take a run directory (its default output under ``RUN/probes/``) or the probe's ``--out``.
"""
from __future__ import annotations

import numpy as np
import pyarrow.compute as pc

from agent.lazy import lazy_module
from agent.rundir import RunError
from agent.rundir.frames import grades, results, steps, token_files, tokens
from agent.rundir.probe_outputs import NoProbeOutput, check_sources, probe_dir, read_table
from agent.rundir.sidecar import verify_file

from .entropy import grouped_tail_entropy, think_segment_entropy

pd = lazy_module("pandas")  # loads on first use: a command's --help needs none of it (agent/lazy.py)
ds = lazy_module("pyarrow.dataset")  # which loads pandas

__all__ = ["results", "steps", "tokens", "token_files", "grades", "entropy", "removal", "grounding", "step_entropies",
           "think_entropy_by_step", "NoProbeOutput"]

ENTROPY_MODES = ("regenerate", "teacher-forced")


def entropy(out, mode: str | None = None) -> pd.DataFrame:
    """One row per probed step (``steps.parquet`` of ``python -m probes.entropy``): ``sample_id``, ``trial``,
    ``step``, ``H_with`` / ``H_without`` (grouped-tail entropy of the step's thinking, nats), ``dH`` (with minus
    without) and its bounds ``dH_low`` / ``dH_high`` where recorded, ``kl_with_without`` (teacher-forced), the
    paper category; ``attrs["mode"]``: regenerate or teacher-forced. ``mode`` picks one when a run has both."""
    names = (f"entropy-{mode}",) if mode else tuple(f"entropy-{m}" for m in ENTROPY_MODES)
    d = probe_dir(out, names, "probes.entropy")
    df = check_sources(read_table(d, ("steps",)), out, f"{d}/steps", "probes.entropy")
    df.attrs["mode"] = mode or next((m for m in ENTROPY_MODES if d.name.endswith(m)), None)
    return df


def removal(out) -> pd.DataFrame:
    """One row per (trajectory, k) replay (``outcomes.csv`` of ``python -m probes.removal``): ``sample_id``,
    ``trial``, ``k``, ``paper_category``, the original and the replayed grade. Refused when a row was computed from a
    line the run no longer holds."""
    d = probe_dir(out, ("removal",), "probes.removal")
    return check_sources(read_table(d, ("outcomes",)), out, f"{d}/outcomes", "probes.removal")


def grounding(out) -> pd.DataFrame:
    """One row per labelled step (``steps.parquet`` of ``python -m probes.grounding``): ``sample_id``,
    ``trial``, ``step``, ``category`` (Image Needed | Image-Derived | Text Only) and the two passes' labels. Refused
    when a row was computed from a line the run no longer holds."""
    d = probe_dir(out, ("grounding",), "probes.grounding")
    return check_sources(read_table(d, ("steps",)), out, f"{d}/steps", "probes.grounding")


def step_entropies(run):
    """One row per (sample, trial, LLM call) of a run: step, state, images in context, H(τ_t).

    ``run`` is :func:`agent.rundir.load_run`'s result. Columns: sample_id, trial, benchmark,
    paper_category, step (the call index), state, n_images (all pixels in context), n_query_images,
    n_think, H, H_exact, gap.
    """

    rows = []
    for line in run.index:  # the line summaries (calls included); only the token columns are read
        tok = run.tokens(line, ["call", "think", "top_logprobs", "exact_entropy"])
        if not tok:
            continue
        e = think_segment_entropy(tok["call"], tok["top_logprobs"], tok["think"], tok.get("exact_entropy"))
        by_call = {int(c): i for i, c in enumerate(e["call"])}
        for c in line.get("calls", []):
            i = by_call.get(c["index"])
            rows.append({"sample_id": line["sample_id"], "trial": line["trial"], "benchmark": line["benchmark"],
                         "paper_category": line.get("paper_category"), "step": c["index"], "state": c["state"],
                         "n_images": c["n_images"], "n_query_images": c.get("n_query_images", 0), "n_think": int(e["n_think"][i]) if i is not None else 0,
                         "H": float(e["H"][i]) if i is not None else np.nan,
                         "H_exact": float(e["H_exact"][i]) if i is not None else np.nan,
                         "gap": float(e["gap"][i]) if i is not None else np.nan})
    return pd.DataFrame(rows)


def think_entropy_by_step(run, *, batch_rows: int = 1 << 16) -> pd.DataFrame:
    """The mean grouped-tail entropy (nats, B.4) of the think tokens at each step over a whole run, in bounded
    memory: a lazy scan (pyarrow.dataset) over the latest lines' sidecars, ``batch_rows`` tokens at a time, only
    ``call``, ``think`` and ``top_logprobs`` read. Each sidecar is first checked against the checksum its line keeps
    (streamed). Columns: ``step``, ``mean_H``, ``tokens``. The paper-scale recipe of docs/frames.md."""
    files = token_files(run)
    for path, sha in zip(files["path"], files["sha256"]):
        try:
            verify_file(path, sha)
        except (OSError, ValueError) as e:
            raise RunError(f"{path}: unreadable token sidecar ({e})") from None
    sums: dict = {}
    counts: dict = {}
    if len(files):
        scan = ds.dataset(list(files["path"]), format="parquet").scanner(
            columns=["call", "top_logprobs"], filter=pc.field("think"), batch_size=batch_rows, use_threads=False)
        for batch in scan.to_batches():
            calls = batch.column("call").to_numpy(zero_copy_only=False)
            lists = batch.column("top_logprobs")
            lens = lists.value_lengths().fill_null(0).to_numpy(zero_copy_only=False)
            k = int(lens.max(initial=0))
            m = np.full((len(lens), max(k, 1)), np.nan, np.float32)
            rows = np.repeat(np.arange(len(lens)), lens)
            cols = np.arange(len(rows)) - np.repeat(np.cumsum(lens) - lens, lens)
            m[rows, cols] = lists.flatten().to_numpy(zero_copy_only=False)
            h = grouped_tail_entropy(m)
            for c in np.unique(calls):
                sel = calls == c
                sums[int(c)] = sums.get(int(c), 0.0) + float(h[sel].sum(dtype=np.float64))
                counts[int(c)] = counts.get(int(c), 0) + int(sel.sum())
    steps_ = sorted(sums)
    return pd.DataFrame({"step": steps_, "mean_H": [sums[s] / counts[s] for s in steps_],
                         "tokens": [counts[s] for s in steps_]})

