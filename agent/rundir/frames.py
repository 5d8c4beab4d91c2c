"""A run as tidy pandas DataFrames: the one reading path of the tables, the figures and the export.

    from analysis import frames            # the same functions, plus the probes' outputs
    frames.results("runs/react-27b")       # one row per result line (sample, trial)
    frames.steps("runs/react-27b")         # one row per LLM call
    frames.tokens("runs/react-27b")        # one row per generated token
    frames.grades("runs/react-27b")        # one row per graded (sample, trial), the latest grade

Each takes a run directory (or a :class:`~agent.rundir.reader.Run`). Columns are listed in each function's
docstring and in docs/frames.md. Only the latest line of a (sample, trial) counts (a ``--retry-errors`` line
supersedes the earlier one), as everywhere in the toolkit.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .common import RunError
from .grades import JUDGES, grades_of
from .reader import Run, load_run

__all__ = ["results", "steps", "tokens", "grades", "RESULT_COLUMNS", "STEP_COLUMNS", "TOKEN_COLUMNS"]

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
    df = pd.DataFrame(recs)
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
    label = run.header.get("label") or run.header.get("method")
    total = "prompt_tokens", "completion_tokens"
    rows = []
    for ln in run.index:
        calls = ln.get("calls") or []
        costs = [c["cost"] for c in calls if c.get("cost") is not None]
        r = {"sample_id": ln.get("sample_id"), "benchmark": ln.get("benchmark"), "trial": int(ln.get("trial", 0)),
             "method": ln.get("method"), "label": label, "model": ln.get("model"),
             "paper_category": ln.get("paper_category"), "status": ln.get("status"), "answer": ln.get("answer"),
             "gold": ln.get("gold"), "n_calls": ln.get("n_calls", len(calls)), "n_tool_calls": ln.get("n_tool_calls", 0),
             "prompt_tokens": sum(c.get("prompt_tokens", 0) for c in calls),
             "completion_tokens": sum(c.get("completion_tokens", 0) for c in calls),
             "think_tokens": sum(c.get("think_tokens", 0) for c in calls),
             "max_prompt_tokens": max((c.get("prompt_tokens", 0) for c in calls), default=0),
             "length_calls": sum(c.get("finish_reason") == "length" for c in calls),
             "cost": sum(costs) if costs else None, "duration_s": ln.get("duration_s"),
             "n_query_images": len(ln.get("query_images") or {})}
        for name, n in (ln.get("tool_calls") or {}).items():
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
    answer | malformed ...), ``tool``, ``cost``."""
    run = _run(run)
    rows = [{"sample_id": ln["sample_id"], "trial": int(ln["trial"]), "benchmark": ln.get("benchmark"),
             "call": c.get("index"), **{k: c.get(k) for k in STEP_COLUMNS[4:]}}
            for ln in run.index for c in ln.get("calls") or []]
    return pd.DataFrame(rows, columns=list(STEP_COLUMNS))


def tokens(run, columns: list[str] | None = None) -> pd.DataFrame:
    """One row per generated token of every result line: ``sample_id``, ``trial``, then the sidecar's columns
    (``columns`` to read only some): ``call``, ``pos``, ``id`` (-1: none), ``text``, ``logprob`` (NaN: none),
    ``think``, ``top_ids`` / ``top_logprobs`` (each row an array of k, -1 / NaN padded), ``exact_entropy``."""
    run = _run(run)
    want = list(columns) if columns is not None else None
    parts = []
    for ln in run.index:
        arrays = run.tokens(ln, None if want is None else list(dict.fromkeys(["call", *want])))
        if not arrays:
            continue
        n = len(arrays["call"])
        cols = {"sample_id": np.full(n, ln["sample_id"], dtype=object), "trial": np.full(n, int(ln["trial"]))}
        for name in (want or arrays):
            a = arrays[name]
            cols[name] = list(a) if a.ndim == 2 else a
        parts.append(pd.DataFrame(cols))
    if not parts:
        return pd.DataFrame(columns=["sample_id", "trial", *(want or TOKEN_COLUMNS)])
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
