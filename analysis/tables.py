"""The paper's tables from run directories (Markdown + CSV), aggregated the way its captions say.

    from analysis.tables import table1, table4, table5
    t = table1(["runs/react-mmsearch", "runs/react-simplevqa", "runs/mmcf-mmsearch"])   # one row per method x model
    write_table(t, "figures/out/table1_accuracy")

- **Table 1 / Table 3** (§4.2, Table 1 caption): one row per (method, backbone), one column per benchmark
  (runs of the same method and model over different benchmarks are merged into one row), accuracy (%) as
  mean ± std over trials, Avg. weighted by the sample counts (= accuracy over the pooled samples, per
  trial). **One judge per table**: accuracy comes from each run's ``judge-<llm|exact>.jsonl``; a table
  over runs graded differently (LLM judge vs exact match, or two judge models) is refused with the runs
  named, unless ``judge="llm"|"exact"`` picks one (runs without it are then listed as missing). The note
  says which judge graded the table; runs compared with different budgets, sampling or history settings
  are flagged in it.
- **Table 4** (§4.4): per agentic method (direct inference is left out), pooled over every run given for it
  (backbone x benchmark): means per
  trajectory of cumulative tokens (prompt + completion over all calls), working context (the largest
  prompt of any single call), tool calls, and each tool (Visual Search = lens_search).
- **Table 5** (§4.4): MMSearch-Plus by number of query images in groups {1, 2, >=3}: accuracy and Visual
  Search / total tool calls per sample, per method, averaged over the backbones (runs) given.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

from agent.rundir import RunError, load_run

__all__ = ["grades_of", "judged_runs", "table1", "table4", "table5", "write_table", "method_label", "model_label",
           "JUDGES"]

JUDGES = ("llm", "exact")
#: Header fields that must agree for numbers to be compared side by side (flagged, not refused).
COMPARED = ("budgets", "sampling", "history_reasoning", "observation_images")


def _latest_grades(path: Path) -> dict:
    recs = {}
    for raw in path.read_text().splitlines():
        try:
            r = json.loads(raw)
        except json.JSONDecodeError:
            continue
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
            recs = _latest_grades(p)
            labels = sorted({r.get("judge", name) for r in recs.values()})
            if len(labels) > 1:
                raise RunError(f"{p} holds grades of {len(labels)} judges ({'; '.join(labels)}); regrade with one "
                               f"judge (python -m agent.judge {run_dir} --regrade)")
            return list(recs.values()), (labels[0] if labels else name)
    want = f"--judge {judge} " if judge else ""
    raise RunError(f"{run_dir}: no {judge + ' ' if judge else ''}judge output; run python -m agent.judge {run_dir} "
                   f"{want}first")


def judged_runs(run_dirs, judge: str | None = None) -> tuple[list[tuple], list[str], str]:
    """``([(run, records)], missing, judge label)`` for a table; refuses runs graded by different judges."""
    got, missing = [], []
    for rd in run_dirs:
        try:
            recs, label = grades_of(rd, judge)
        except RunError as e:
            missing.append(str(e))
            continue
        got.append((load_run(rd), recs, label))
    labels = {}
    for run, _, label in got:
        labels.setdefault(label, []).append(str(run.path))
    if len(labels) > 1:
        detail = "; ".join(f"{lab}: {', '.join(paths)}" for lab, paths in labels.items())
        raise RunError(f"these runs were graded by different judges ({detail}). One table, one judge: pass "
                       "--judge llm or --judge exact (runs lacking it are listed as missing), or regrade")
    return [(r, recs) for r, recs, _ in got], missing, next(iter(labels), "")


def method_label(run) -> str:
    h = run.header
    return h.get("label") or h.get("method") or "?"


def model_label(run) -> str:
    h = run.header
    m = h.get("model") or {}
    return (m.get("served_model") or (run.index[0].get("model") if run.index else None)
            or (h.get("backend") or {}).get("model") or "")


def _comparability_note(runs) -> str:
    seen: dict = {}
    for run in runs:
        for k in COMPARED:
            seen.setdefault(k, {}).setdefault(json.dumps(run.header.get(k), sort_keys=True), []).append(run.path.name)
    diffs = []
    for k, vals in seen.items():
        if len(vals) > 1:
            alts = " vs ".join(f"{v}: {', '.join(names)}" for v, names in vals.items())
            diffs.append(f"{k} differs ({alts})")
    return ("**Warning: compared runs differ:** " + "; ".join(diffs) + ".") if diffs else ""


def _per_trial_acc(df) -> tuple[float, float, list[float]]:
    per = [g["correct"].mean() * 100 for _, g in df.groupby("trial")]
    return float(np.mean(per)), (float(np.std(per, ddof=1)) if len(per) > 1 else 0.0), per


def table1(run_dirs, judge: str | None = None) -> "pd.DataFrame":
    """Table 1 (and Table 3 when given ReAct-Removal@k runs): accuracy (%) mean ± std over trials."""
    import pandas as pd

    runs, missing, label = judged_runs(run_dirs, judge)
    if not runs:
        raise RunError("no judged run to tabulate: " + "; ".join(missing))
    groups: dict = {}
    for run, recs in runs:
        key = (method_label(run), model_label(run))
        benches = {r["benchmark"] for r in recs}
        have = groups.setdefault(key, [])
        clash = benches & {r["benchmark"] for _, rs in have for r in rs}
        if clash:
            raise RunError(f"two runs of {key[0]} on {key[1]} cover {sorted(clash)}: give one run per method, "
                           f"model and benchmark ({run.path})")
        have.append((run, recs))
    rows, counts = [], {}
    for (method, model), items in groups.items():
        df = pd.DataFrame([r for _, recs in items for r in recs])
        df["correct"] = df["grade"] == "CORRECT"
        row = {"method": method, "model": model}
        for b, g in df.groupby("benchmark"):
            m, s, _ = _per_trial_acc(g)
            counts[b] = max(counts.get(b, 0), int((g.trial == g.trial.min()).sum()))
            row[b] = f"{m:.1f} ± {s:.1f}"
        m, s, _ = _per_trial_acc(df)
        row["Avg."] = f"{m:.1f} ± {s:.1f}"
        row["trials"] = int(df["trial"].nunique())
        rows.append(row)
    out = pd.DataFrame(rows)
    benches = sorted(counts)
    out = out.rename(columns={b: f"{b} (n={counts[b]})" for b in benches})
    out = out[["method", "model", *[f"{b} (n={counts[b]})" for b in benches], "Avg.", "trials"]]
    notes = [f"Accuracy (%), mean ± std (ddof=1) over trials; Avg. weighted by sample counts. Judge: {label}."]
    cmp_note = _comparability_note([r for r, _ in runs])
    if cmp_note:
        notes.append(cmp_note)
    if missing:
        notes.append("Not included (no such judge output): " + "; ".join(missing))
    out.attrs["note"] = "\n\n".join(notes)
    out.attrs["judge"] = label
    out.attrs["missing"] = missing
    return out


def _trajectory_frame(run):
    s = run.samples()
    s = s[s.status.isin(["ok", "no_answer"])].copy()  # harness errors and timeouts are not trajectories
    for t in ("lens_search", "search", "visit"):
        col = f"tool_{t}"
        s[col] = s[col].fillna(0) if col in s else 0
    return s


def table4(run_dirs) -> "pd.DataFrame":
    """Table 4: per method, pooled over all its runs: cumulative tokens, working context, tool calls by type."""
    import pandas as pd

    pooled: dict = {}
    for rd in run_dirs:
        run = load_run(rd)
        method = method_label(run)
        if run.header.get("method") == "direct":  # Table 4 compares the agentic methods (§4.4)
            continue
        s = _trajectory_frame(run)
        s["run"] = run.path.name
        pooled.setdefault(method, []).append(s)
    rows = []
    for method, frames in pooled.items():
        s = pd.concat(frames, ignore_index=True)
        rows.append({"method": method, "runs": len(frames), "trajectories": len(s),
                     "cumulative tokens": s.total_tokens.mean(), "working context": s.max_prompt_tokens.mean(),
                     "LLM calls": s.n_calls.mean(), "tool calls": s.n_tool_calls.mean(),
                     "Visual Search (lens_search)": s.tool_lens_search.mean(),
                     "Text Retrieval (search)": s.tool_search.mean(), "Web Visit (visit)": s.tool_visit.mean()})
    df = pd.DataFrame(rows)
    df.attrs["note"] = ("Means per trajectory, pooled over every run given for a method (backbone x benchmark). "
                        "Cumulative tokens = prompt + completion tokens over all LLM calls; working context = the "
                        "largest prompt of any single call. Trajectories that ended in a harness error or timeout "
                        "are excluded.")
    return df


def _image_group(n: int) -> str:
    return "1 image" if n == 1 else "2 images" if n == 2 else ">=3 images" if n >= 3 else "0 images"


def table5(run_dirs, benchmark: str = "mmsearch_plus", judge: str | None = None) -> "pd.DataFrame":
    """Table 5: accuracy (%) and Visual Search / total tool calls on MMSearch-Plus by number of query images."""
    import pandas as pd

    runs, missing, label = judged_runs(run_dirs, judge)
    per_run = []
    for run, recs in runs:
        df = pd.DataFrame([r for r in recs if r["benchmark"] == benchmark])
        if df.empty:
            continue
        lines = {(ln["sample_id"], ln["trial"]): ln for ln in run.index}
        df["n_images"] = [len((lines.get((a, b)) or {}).get("query_images") or {}) for a, b in zip(df.sample_id, df.trial)]
        df["vs"] = [((lines.get((a, b)) or {}).get("tool_calls") or {}).get("lens_search", 0) for a, b in zip(df.sample_id, df.trial)]
        df["tools"] = [(lines.get((a, b)) or {}).get("n_tool_calls", 0) for a, b in zip(df.sample_id, df.trial)]
        df["group"] = df["n_images"].map(_image_group)
        df["correct"] = df.grade == "CORRECT"
        for grp, g in df.groupby("group"):
            per_run.append({"method": method_label(run), "model": model_label(run), "group": grp,
                            "n": int((g.trial == g.trial.min()).sum()),
                            "accuracy": g.groupby("trial").correct.mean().mean() * 100,
                            "vs": g["vs"].mean(), "tools": g["tools"].mean()})
    if not per_run:
        out = pd.DataFrame()
        out.attrs["note"] = f"no judged run covers {benchmark}"
        return out
    pr = pd.DataFrame(per_run)
    order = [g for g in ("1 image", "2 images", ">=3 images") if g in set(pr.group)]
    n = pr.groupby("group")["n"].max()
    rows = []
    for method, g in pr.groupby("method", sort=False):
        row = {"method": method, "backbones": g["model"].nunique()}
        for grp in order:
            x = g[g.group == grp]
            row[f"{grp} (n={n[grp]}) accuracy"] = f"{x.accuracy.mean():.1f}" if len(x) else ""
            row[f"{grp} (n={n[grp]}) VS / total"] = f"{x.vs.mean():.2f} / {x.tools.mean():.2f}" if len(x) else ""
        rows.append(row)
    out = pd.DataFrame(rows)
    out.attrs["note"] = (f"{benchmark}: accuracy (%) and Visual Search / total tool calls per sample by number of "
                         f"query images, mean over trials, averaged over the backbones given. Judge: {label}.")
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
