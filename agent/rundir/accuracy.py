"""Accuracy over a run's grades as Table 1 lays it out: per benchmark, per category and weighted overall, mean ±
std over trials (paper B.6: ddof = 1).

    from agent.rundir.accuracy import accuracy_table
    summary = accuracy_table(records, label="llm", run_label="react-27b")   # records: grades.grades_of(RUN)[0]
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..lazy import lazy_module
from ..record import Grade
from .common import RunError

if TYPE_CHECKING:  # the types mypy checks against
    import pandas as pd
else:
    pd = lazy_module("pandas")  # loads on first use: a command's --help needs none of it (agent/lazy.py)

__all__ = ["accuracy_table", "fmt_mean_std"]

#: What Table 1 reads of each grade.
_COLUMNS = {"trial", "benchmark", "category", "paper_category", "grade"}


def _mean_std(vals: list[float], refused: bool = False) -> tuple[float, float | None]:
    """Mean and std (ddof = 1) in %; the std is None (printed "—") for one trial (undefined) or when refused."""
    a = np.asarray(vals, dtype=float)
    return float(a.mean() * 100), (float(a.std(ddof=1) * 100) if len(a) > 1 and not refused else None)


def fmt_mean_std(mean: float, std: float | None) -> str:
    return f"{mean:.1f} ± {std:.1f}" if std is not None else f"{mean:.1f} ± —"


def accuracy_table(records: "list[Grade]", *, label: str = "", run_label: str = "", std_refused: str | None = None) -> dict:
    """Accuracy (%) per benchmark, per category and weighted overall: mean ± std over trials.

    ``std_refused``: why no std may be given (identical trials); the std is then None and the note says why."""
    df = pd.DataFrame([r.model_dump(include=_COLUMNS) for r in records], columns=list(_COLUMNS))
    if df.empty:
        raise RunError("nothing to grade: the run has no finished trajectories")
    df["correct"] = df["grade"] == "CORRECT"
    trials = sorted(df["trial"].unique())

    def block(sub: "pd.DataFrame") -> dict:
        per_trial = [sub[sub.trial == t]["correct"].mean() for t in trials if (sub.trial == t).any()]
        m, s = _mean_std(per_trial, refused=std_refused is not None)
        return {"n": int(sub[sub.trial == trials[0]].shape[0]), "mean": m, "std": s, "n_trials": len(per_trial),
                "per_trial": [p * 100 for p in per_trial],
                "grades": sub["grade"].value_counts().to_dict()}

    benchmarks = {b: block(g) for b, g in df.groupby("benchmark")}
    categories = {c: block(g) for c, g in df.groupby(df["category"].fillna("(none)"))}
    paper_categories = {c: block(g) for c, g in df.groupby(df["paper_category"].fillna("(none)"))}
    overall = block(df)
    cols, row = [], {"method": run_label}
    for b, r in benchmarks.items():
        cols.append(f"{b} (n={r['n']})")
        row[cols[-1]] = fmt_mean_std(r["mean"], r["std"])
    row["Avg."] = fmt_mean_std(overall["mean"], overall["std"])
    table = pd.DataFrame([row])
    why = (f" No std: {std_refused}." if std_refused else
           " No std: one trial (a std over one trial is undefined)." if len(trials) < 2 else "")
    md = [f"Accuracy (%), mean ± std (ddof = 1) over {len(trials)} trial(s). Judge: {label}.{why}", "",
          "| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns),
          "| " + " | ".join(str(v) for v in row.values()) + " |", "",
          "| category | n | accuracy |", "|---|---|---|"]
    md += [f"| {c} | {r['n']} | {fmt_mean_std(r['mean'], r['std'])} |" for c, r in categories.items()]
    unparsed = int((df["grade"] == "UNPARSED").sum())
    if unparsed:
        md += ["", f"**{unparsed} UNPARSED judge replies** (counted as not correct; see judge-*.jsonl)."]
    numeric = pd.DataFrame([{"method": run_label, "benchmark": b, "mean": r["mean"], "std": r["std"],
                             "n_trials": r["n_trials"], "n": r["n"]} for b, r in [*benchmarks.items(), ("Avg.", overall)]])
    return {"trials": [int(t) for t in trials], "benchmarks": benchmarks, "categories": categories,
            "paper_categories": paper_categories, "overall": overall, "unparsed": unparsed,
            "std_refused": std_refused, "markdown": "\n".join(md) + "\n", "table": numeric}
