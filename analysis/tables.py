"""The paper's tables from run directories (Markdown + CSV).

    from analysis.tables import table1, table4, table5
    t = table1(["runs/react", "runs/mmcf"])          # accuracy mean ± std per benchmark + weighted Avg.
    t.to_markdown()

Accuracy comes from each run's judge output (``judge-llm.jsonl``, else ``judge-exact.jsonl``, which is
then named in the table's label); a run without either is an error that says to run ``agent.judge``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

from agent.rundir import RunError, load_run

__all__ = ["grades_of", "table1", "table4", "table5", "write_table"]


def grades_of(run_dir) -> tuple[list[dict], str]:
    """The latest grade per (sample, trial) of a run, and the judge's label."""
    run_dir = Path(run_dir)
    for name in ("llm", "exact"):
        p = run_dir / f"judge-{name}.jsonl"
        if p.exists():
            recs = {}
            for raw in p.read_text().splitlines():
                try:
                    r = json.loads(raw)
                except json.JSONDecodeError:
                    continue
                recs[(r["sample_id"], r["trial"])] = r
            label = next(iter(recs.values()))["judge"] if recs else name
            return list(recs.values()), label
    raise RunError(f"{run_dir}: no judge output; run python -m agent.judge {run_dir} first")


def _label(run) -> str:
    h = run.header
    model = (run.lines[0].get("model") if run.lines else None) or (h.get("backend") or {}).get("model") or ""
    return f"{h.get('label') or h.get('method')}" + (f" ({model})" if model else "")


def _acc(records: list[dict]) -> dict:
    import pandas as pd

    df = pd.DataFrame(records)
    df["correct"] = df["grade"] == "CORRECT"
    out = {}
    trials = sorted(df["trial"].unique())
    for b, g in [*df.groupby("benchmark"), ("Avg.", df)]:
        per = [g[g.trial == t]["correct"].mean() * 100 for t in trials if (g.trial == t).any()]
        out[b] = (float(np.mean(per)), float(np.std(per, ddof=1)) if len(per) > 1 else 0.0,
                  int((g.trial == trials[0]).sum()))
    return out


def table1(run_dirs) -> "pd.DataFrame":
    """Table 1 (and Table 3 when given ReAct-Removal@k runs): accuracy (%) mean ± std over trials."""
    import pandas as pd

    rows, judges = [], set()
    for rd in run_dirs:
        run = load_run(rd)
        recs, label = grades_of(rd)
        judges.add(label)
        acc = _acc(recs)
        row = {"method": _label(run)}
        for b, (m, s, n) in acc.items():
            row[b if b == "Avg." else f"{b} (n={n})"] = f"{m:.1f} ± {s:.1f}"
        rows.append(row)
    df = pd.DataFrame(rows)
    cols = ["method"] + sorted(c for c in df.columns if c not in ("method", "Avg.")) + ["Avg."]
    df = df[cols]
    df.attrs["note"] = "Accuracy (%), mean ± std (ddof=1) over trials; Avg. weighted by sample counts. Judge: " + "; ".join(sorted(judges))
    return df


def table4(run_dirs) -> "pd.DataFrame":
    """Table 4: cumulative tokens, working context (max prompt tokens in one call), tool calls by type."""
    import pandas as pd

    rows = []
    for rd in run_dirs:
        run = load_run(rd)
        s = run.samples()
        s = s[s.status.isin(["ok", "no_answer"])]
        row = {"method": _label(run), "trajectories": len(s), "LLM calls": s.n_calls.mean(),
               "cumulative tokens": s.total_tokens.mean(), "working context (max prompt tokens)": s.max_prompt_tokens.mean()}
        for t in ("lens_search", "search", "visit"):
            row[f"{t} calls"] = s.get(f"tool_{t}", pd.Series(0, index=s.index)).fillna(0).mean()
        rows.append(row)
    df = pd.DataFrame(rows)
    df.attrs["note"] = "Means per trajectory (trajectories that ended in a harness error or timeout excluded)."
    return df


def table5(run_dirs, benchmark: str = "mmsearch_plus") -> "pd.DataFrame":
    """Table 5: accuracy (%) on MMSearch-Plus by the number of query images, mean over trials."""
    import pandas as pd

    rows = []
    for rd in run_dirs:
        run = load_run(rd)
        recs, label = grades_of(rd)
        n_img = {(ln["sample_id"], ln["trial"]): len(ln.get("query_images") or {}) for ln in run.lines}
        df = pd.DataFrame([r for r in recs if r["benchmark"] == benchmark])
        if df.empty:
            continue
        df["n_images"] = [n_img.get((a, b), 0) for a, b in zip(df.sample_id, df.trial)]
        df["correct"] = df.grade == "CORRECT"
        row = {"method": _label(run)}
        for k, g in df.groupby("n_images"):
            row[f"{k} image{'s' if k != 1 else ''} (n={int((g.trial == g.trial.min()).sum())})"] = \
                f"{g.groupby('trial').correct.mean().mean() * 100:.1f}"
        rows.append(row)
    out = pd.DataFrame(rows)
    out.attrs["note"] = f"Accuracy (%) on {benchmark} by number of query images, mean over trials."
    return out


def write_table(df, stem) -> list[Path]:
    """``stem.md`` (with the note) and ``stem.csv``."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    cols = list(df.columns)
    fmt = [[f"{v:.1f}" if isinstance(v, float) else str(v) for v in row] for row in df.itertuples(index=False)]
    md = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols), *("| " + " | ".join(r) + " |" for r in fmt)]
    if df.attrs.get("note"):
        md = [df.attrs["note"], "", *md]
    stem.with_suffix(".md").write_text("\n".join(md) + "\n")
    df.to_csv(stem.with_suffix(".csv"), index=False)
    return [stem.with_suffix(".md"), stem.with_suffix(".csv")]
