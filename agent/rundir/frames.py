"""A run and the probes' outputs as tidy pandas DataFrames: the one reading path of the tables, the figures and
the export (docs/frames.md).

    from agent.rundir import frames
    frames.results("runs/react-27b")       # one row per result line (sample, trial)
    frames.steps("runs/react-27b")         # one row per LLM call
    frames.tokens("runs/react-27b")        # one row per generated token
    frames.grades("runs/react-27b")        # one row per graded (sample, trial), the latest grade
    frames.entropy("runs/react-27b")       # Figure 2(b): one row per probed step (probes/entropy)
    frames.removal("runs/react-27b")       # Figure 2(c): one row per (trajectory, k) replay (probes/removal/)
    frames.grounding("runs/react-27b")     # Figure 2(a): one row per labelled step (probes/grounding/)

Each takes a run directory (or a :class:`~agent.rundir.reader.Run`); the probe readers take a run directory (its
default output under ``RUN/probes/``) or the probe's ``--out``. Columns are listed in each function's docstring and
in docs/frames.md. Only the latest line of a (sample, trial) counts (a ``--retry-errors`` line
supersedes the earlier one), as everywhere in the toolkit.
"""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analysis.estimators.entropy import grouped_tail_entropy, think_segment_entropy

from ..lazy import lazy_module
from .common import RunError
from .grades import JUDGES, grades_of
from .probe_outputs import NoProbeOutput, check_sources, probe_dir, read_table
from .reader import Run, load_run
from .sidecar import read_footer, verify_file
from .writer import RunDir

if TYPE_CHECKING:  # the types mypy checks against
    import pandas as pd
else:
    pd = lazy_module("pandas")  # loads on first use: a command's --help needs none of it (agent/lazy.py)
ds = lazy_module("pyarrow.dataset")  # which loads pandas

__all__ = ["results", "steps", "tokens", "token_files", "grades", "entropy", "removal", "grounding", "step_entropies",
           "think_entropy_by_step", "NoProbeOutput", "RESULT_COLUMNS", "STEP_COLUMNS", "TOKEN_COLUMNS",
           "TOKEN_BYTES", "TOKENS_MAX_MB"]

RESULT_COLUMNS = ("sample_id", "benchmark", "trial", "method", "label", "model", "paper_category", "status",
                  "answer", "gold", "correct", "judge", "n_calls", "n_tool_calls", "prompt_tokens",
                  "completion_tokens", "think_tokens", "total_tokens", "max_prompt_tokens", "length_calls", "cost",
                  "duration_s", "n_query_images")
STEP_COLUMNS = ("sample_id", "trial", "benchmark", "call", "state", "branch", "forced", "n_images",
                "n_query_images", "prompt_tokens", "completion_tokens", "cached_tokens", "think_tokens", "n_tokens",
                "latency_s", "finish_reason", "action", "tool", "cost")
#: The sidecar's columns (agent/rundir/sidecar.py), after the unit's keys.
TOKEN_COLUMNS = ("call", "pos", "id", "text", "logprob", "think", "top_ids", "top_logprobs", "exact_entropy")


def _run(run) -> Run:
    return run if isinstance(run, Run) else load_run(run)


def _grade_frame(run: Run, judge: str | None) -> pd.DataFrame | None:
    """The latest grades as a frame; None when the run has no judge output (``judge`` not given). A judge file
    that cannot be used as it is (several judges, a rerouted judge) is refused, naming why."""
    if judge is None and not any((run.path / f"judge-{name}.jsonl").exists() for name in JUDGES):
        return None
    recs, label = grades_of(run.path, judge)
    df = pd.DataFrame([r.model_dump() for r in recs])
    if df.empty:
        return None
    df["trial"] = df["trial"].astype(int)
    df["correct"] = df["grade"] == "CORRECT"
    df["judge"] = label
    return df


def results(run, judge: str | None = None) -> pd.DataFrame:
    """One row per result line: ``sample_id``, ``benchmark``, ``trial``, ``method``, ``label`` (method and
    protocol, as tables name rows), ``model`` (served), ``paper_category``, ``status`` (ok | no_answer | error |
    timeout), ``answer``, ``gold``, ``correct`` (bool; NA when not judged) and ``judge`` (its label),
    ``n_calls``, ``n_tool_calls``, ``prompt_tokens`` / ``completion_tokens`` / ``think_tokens`` (summed over the
    calls), ``total_tokens`` (their sum: cumulative tokens), ``max_prompt_tokens`` (the working context),
    ``length_calls`` (calls cut by the token limit), ``cost`` (the provider's reported cost, NA when none
    reported), ``duration_s``, ``n_query_images``, and ``tool_<name>`` (calls per tool). ``judge``: which grades
    (``llm`` or ``exact``; default: the LLM judge's when there are any)."""
    run = _run(run)
    label = run.header.label or run.header.method
    total = "prompt_tokens", "completion_tokens"
    rows = []
    for ln in run.index:
        calls = ln.calls
        costs = [c.cost for c in calls if c.cost is not None]
        r = {"sample_id": ln.sample_id, "benchmark": ln.benchmark, "trial": ln.trial, "method": ln.method,
             "label": label, "model": ln.model, "paper_category": ln.paper_category, "status": ln.status,
             "answer": ln.answer, "gold": ln.gold, "n_calls": ln.n_calls, "n_tool_calls": ln.n_tool_calls,
             "prompt_tokens": sum(c.prompt_tokens for c in calls),
             "completion_tokens": sum(c.completion_tokens for c in calls),
             "think_tokens": sum(c.think_tokens for c in calls),
             "max_prompt_tokens": max((c.prompt_tokens for c in calls), default=0),
             "length_calls": sum(c.finish_reason == "length" for c in calls),
             "cost": sum(costs) if costs else None, "duration_s": ln.duration_s,
             "n_query_images": len(ln.query_images)}
        for name, n in ln.tool_calls.items():
            r[f"tool_{name}"] = n
        rows.append(r)
    df = pd.DataFrame(rows, columns=None if rows else [c for c in RESULT_COLUMNS if c not in ("correct", "judge")])
    g = _grade_frame(run, judge)
    if g is not None and len(df):
        g = g[["sample_id", "trial", "correct", "judge"]]
        df = df.merge(g, on=["sample_id", "trial"], how="left")
        df["correct"] = df["correct"].astype("boolean")
    else:
        df["correct"] = pd.Series(pd.NA, index=df.index, dtype="boolean")
        df["judge"] = None
    df["total_tokens"] = df[list(total)].sum(axis=1)  # cumulative tokens (Table 4)
    tools = sorted(c for c in df.columns if c.startswith("tool_"))
    df[tools] = df[tools].fillna(0).astype(int)
    return df[[*RESULT_COLUMNS, *tools]]


def steps(run) -> pd.DataFrame:
    """One row per LLM call of every result line: ``sample_id``, ``trial``, ``benchmark``, ``call`` (the
    line's event index), ``state`` (main | branch), ``branch``, ``forced``, ``n_images`` / ``n_query_images``
    (in the call's context), ``prompt_tokens``, ``completion_tokens``, ``cached_tokens``, ``think_tokens``,
    ``n_tokens`` (generated tokens recorded), ``latency_s``, ``finish_reason``, ``action`` (tool_call |
    answer | malformed ...), ``tool``, ``cost``.

    Given a path, each line's summary is cut to these values as the index is read (a tuple a call, ours: the
    summaries of a 10,000-line run are ~200 MB, its steps ~20 MB; scripts/bench_frames.py)."""
    if isinstance(run, Run):
        lines = [(ln.sample_id, ln.trial, _step_values(ln.benchmark, (tuple(getattr(c, k) for k in _CALL_KEYS)
                                                                      for c in ln.calls))) for ln in run.index]
    else:  # each summary cut to its calls' values as the index is read
        lines = [(*k, e["_steps"]) for k, e in RunDir(run).latest(_steps_only).items()]
    per = [calls for _, _, calls in lines]
    n = [len(calls) for calls in per]
    cols = {"sample_id": np.repeat(np.array([sid for sid, _, _ in lines], dtype=object), n),
            "trial": np.repeat(np.array([trial for _, trial, _ in lines], dtype=np.int64), n)}
    for j, name in enumerate(STEP_COLUMNS[2:]):  # column by column: one column's values held at a time
        cols[name] = pd.Series([call[j] for calls in per for call in calls])
    return pd.DataFrame(cols, columns=list(STEP_COLUMNS))


_CALL_KEYS = ("index", *STEP_COLUMNS[4:])


def _step_values(benchmark: str, calls) -> list[tuple]:
    """What :func:`steps` keeps of a line's calls (each its values of ``_CALL_KEYS``): per call, its values in
    ``STEP_COLUMNS`` order (after the key), each string interned (a run's few states, actions, tools and finish
    reasons held once, not once a call)."""
    return [tuple(sys.intern(v) if type(v) is str else v for v in (benchmark, *values)) for values in calls]


def _steps_only(summary: dict) -> dict:
    """An index entry cut to :func:`_step_values` as it is read (the run directory's own projection)."""
    return {"_steps": _step_values(summary["benchmark"], (map(c.get, _CALL_KEYS) for c in summary["calls"]))}


#: What one token holds in a pandas frame, by column (measured on a paper-shaped run, ``scripts/bench_frames.py``;
#: a list column is an object array of numpy arrays of k): what :func:`tokens` says it would hold before it reads.
TOKEN_BYTES = {"call": 2, "pos": 4, "id": 4, "text": 60, "logprob": 4, "think": 1, "top_ids": 350, "top_logprobs": 350,
               "exact_entropy": 4, "unload_kl": 4, "unload_dH": 4}


def _nullable_int(t: "pa.DataType"):
    """pandas' nullable integer for an Arrow integer column (ids with nulls stay whole numbers), else the default."""
    return {pa.int16(): pd.Int16Dtype(), pa.int32(): pd.Int32Dtype()}.get(t)


#: The most a :func:`tokens` call holds unless told otherwise (ours): above it, aggregate without holding the tokens
#: (docs/frames.md, "Paper-scale: tokens without holding them").
TOKENS_MAX_MB = 2048


def token_files(run) -> pd.DataFrame:
    """One row per latest line that recorded tokens: ``sample_id``, ``trial``, ``path`` (the sidecar, absolute,
    checked to lie inside the run), ``sha256`` (the checksum its line keeps) and ``rows`` (its tokens, from the
    file's footer). The sidecars are plain Parquet: a lazy scan over ``path`` (duckdb, polars, pyarrow.dataset)
    aggregates a whole run in bounded memory (docs/frames.md)."""
    run = _run(run)
    rows = []
    for ln in run.index:
        p = run.tokens_path(ln)
        if p is None:
            continue
        try:
            n = read_footer(p).num_rows
        except (OSError, ValueError) as e:
            raise RunError(f"{p}: unreadable token sidecar ({e}); python -m agent.rundir check {run.path}") from None
        rows.append({"sample_id": ln.sample_id, "trial": ln.trial, "path": str(p.resolve()),
                     "sha256": ln.tokens_sha256, "rows": n})
    return pd.DataFrame(rows, columns=["sample_id", "trial", "path", "sha256", "rows"])


def tokens(run, columns: list[str] | None = None, *, sample_ids=None, filters=None,
           max_mb: float = TOKENS_MAX_MB) -> pd.DataFrame:
    """One row per generated token of the latest lines: ``sample_id``, ``trial``, then the sidecar's columns
    (``columns`` to read only some), each value as stored: ``call``, ``pos``, ``id`` (pandas Int32; NA: the server
    gave none), ``text``, ``logprob`` (NaN: none), ``think``, ``top_ids`` / ``top_logprobs`` (each an array of the
    alternatives the server sent, most likely first: up to k; None where none), ``exact_entropy``.

    ``sample_ids``: those samples only; ``filters``: Parquet row filters in pyarrow's form (``[("think", "==",
    True), ("call", "<=", 5)]``), applied as each file is read. Before reading, the frame's size is estimated from
    the files' footers (:data:`TOKEN_BYTES` a token per column); above ``max_mb`` it is refused, saying how much it
    would hold: ask for fewer columns or rows, or aggregate without holding them (docs/frames.md)."""
    run = _run(run)
    want = list(dict.fromkeys(columns)) if columns is not None else list(TOKEN_COLUMNS)
    files = token_files(run)
    if sample_ids is not None:
        files = files[files["sample_id"].isin(set(map(str, sample_ids)))]
    est = float(files["rows"].sum()) * (sum(TOKEN_BYTES.get(c, 8) for c in want) + 16) / 2**20
    if est > max_mb:
        raise RunError(f"{run.path}: frames.tokens would hold ~{est:,.0f} MB ({int(files['rows'].sum()):,} tokens x "
                       f"{', '.join(want)}), over max_mb={max_mb:g}. Read fewer columns, sample_ids= or filters=, "
                       "or aggregate without holding the tokens (docs/frames.md: paper-scale)")
    parts = []
    by_key = {ln.key: ln for ln in run.index}
    for sid, trial in zip(files["sample_id"], files["trial"]):
        t = run.token_table(by_key[(sid, trial)], want, filters=filters)
        if t is None or not t.num_rows:
            continue
        df = t.to_pandas(types_mapper=_nullable_int)  # ids with nulls stay whole numbers (pandas Int32)
        df.insert(0, "trial", trial)
        df.insert(0, "sample_id", sid)
        parts.append(df)
    if not parts:
        return pd.DataFrame(columns=["sample_id", "trial", *want])
    return pd.concat(parts, ignore_index=True)


def grades(run, judge: str | None = None) -> pd.DataFrame:
    """One row per graded (sample, trial), its latest grade: ``sample_id``, ``trial``, ``benchmark``, ``grade``
    (CORRECT | INCORRECT | ...), ``correct`` (bool), ``judge`` (the judge's label) and the judge's own fields
    (``paper_category``, the judge's reply, ...). Refuses a file holding several judges' grades. ``judge``:
    ``llm`` or ``exact`` (default: the LLM judge's when there are any)."""
    run = _run(run)
    g = _grade_frame(run, judge)
    if g is None:
        raise RunError(f"{run.path}: no judge output; run python -m agent.judge {run.path} first")
    return g


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
        for c in line.calls:
            i = by_call.get(c.index)
            rows.append({"sample_id": line.sample_id, "trial": line.trial, "benchmark": line.benchmark,
                         "paper_category": line.paper_category, "step": c.index, "state": c.state,
                         "n_images": c.n_images, "n_query_images": c.n_query_images,
                         "n_think": int(e["n_think"][i]) if i is not None else 0,
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

