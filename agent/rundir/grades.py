"""Stored grades: the judges' ``judge-<name>.jsonl`` files of a run, read back, and accuracy over them.

Records only (no model call): what ``agent.judge`` wrote, read as bytes line by line (a torn line is skipped),
the latest grade per (sample, trial), and accuracy per benchmark and category as Table 1 lays it out
(paper B.6: mean ± std, ddof = 1, over trials).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from ..trajectory import responses_fingerprint
from .common import RunError

__all__ = ["JUDGES", "read_grades", "latest_grades", "grades_of", "identical_trials", "accuracy_table", "fmt_mean_std"]

JUDGES = ("llm", "exact")


def identical_trials(lines) -> str | None:
    """Why a std over these trials would be meaningless, or None: every sample run in several trials has the
    very same responses in each (one trial repeated: a deterministic server without per-trial seeds, or a
    scripted backend). Table 1's "± std over three independent trials" needs them to differ somewhere."""
    by_sample: dict = {}
    for ln in lines:  # a line's summary carries its digest (runs recorded before it: computed from the events)
        by_sample.setdefault(ln["sample_id"], {})[ln["trial"]] = ln.get("responses_sha") or responses_fingerprint(ln)
    multi = {s: d for s, d in by_sample.items() if len(d) > 1}
    if not multi or any(len(set(d.values())) > 1 for d in multi.values()):
        return None
    trials = sorted({t for d in multi.values() for t in d})
    return (f"the trials {trials} are identical: each of the {len(multi)} samples run in several trials has the same "
            "responses in every trial (a deterministic server without per-trial seeds, or a scripted backend), so "
            "they are one trial repeated and a std over them is refused")


def read_grades(path) -> list[dict]:
    """The records of a ``judge-*.jsonl``, read as bytes line by line: a torn line (a kill mid-write, a cut
    multi-byte character) is skipped, never a crash."""
    out = []
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return out
    for raw in data.split(b"\n"):
        if not raw.strip():
            continue
        try:
            r = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            continue
        if isinstance(r, dict):
            out.append(r)
    return out


def _mean_std(vals: list[float], refused: bool = False) -> tuple[float, float | None]:
    """Mean and std (ddof = 1) in %; the std is None (printed "—") for one trial (undefined) or when refused."""
    a = np.asarray(vals, dtype=float)
    return float(a.mean() * 100), (float(a.std(ddof=1) * 100) if len(a) > 1 and not refused else None)


def fmt_mean_std(mean: float, std: float | None) -> str:
    return f"{mean:.1f} ± {std:.1f}" if std is not None else f"{mean:.1f} ± —"


def accuracy_table(records: list[dict], *, label: str = "", run_label: str = "", std_refused: str | None = None) -> dict:
    """Accuracy (%) per benchmark, per category and weighted overall: mean ± std over trials.

    ``std_refused``: why no std may be given (identical trials); the std is then None and the note says why."""
    df = pd.DataFrame(records)
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



def latest_grades(path: Path) -> dict:
    recs = {}
    for r in read_grades(path):  # torn lines (a kill mid-write, a cut multi-byte character) skipped
        if "sample_id" in r and "trial" in r:
            recs[(r["sample_id"], r["trial"])] = r
    return recs



def grades_of(run_dir, judge: str | None = None) -> tuple[list[dict], str]:
    """The latest grade per (sample, trial) of a run, and the judge's label.

    ``judge=None`` takes the LLM judge's output when there is one, else exact match. A file holding the
    grades of more than one judge is refused (a table must never mix judges).
    """
    run_dir = Path(run_dir)
    names = [judge] if judge else list(JUDGES)
    for name in names:
        p = run_dir / f"judge-{name}.jsonl"
        if p.exists():
            recs = latest_grades(p)
            labels = sorted({r.get("judge", name) for r in recs.values()})
            if len(labels) > 1:
                raise RunError(f"{p} holds grades of {len(labels)} judges ({'; '.join(labels)}); regrade with one "
                               f"judge (python -m agent.judge {run_dir} --regrade)")
            label = labels[0] if labels else name
            served = sorted({r["judge_served_model"] for r in recs.values() if r.get("judge_served_model")})
            if len(served) > 1:  # the judge's replies named different models: rerouted mid-run
                raise RunError(f"{p}: the judge's replies name {len(served)} models ({', '.join(served)}): the judge "
                               f"was rerouted while grading. Regrade with one (python -m agent.judge {run_dir} --regrade)")
            if served:
                label = f"{label} [served: {served[0]}]"
            return list(recs.values()), label
    want = f"--judge {judge} " if judge else ""
    raise RunError(f"{run_dir}: no {judge + ' ' if judge else ''}judge output; run python -m agent.judge {run_dir} "
                   f"{want}first")


