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
- **Table 4** (§4.4): per agentic method (direct inference is left out) and backbone, pooled over the
  benchmarks given, plus a row per method pooled over the backbones when every method covers the same
  ones (never over different model mixes): means per
  trajectory of cumulative tokens (prompt + completion over all calls), working context (the largest
  prompt of any single call), tool calls, and each tool (Visual Search = lens_search).
- **Table 5** (§4.4): MMSearch-Plus by number of query images in groups {1, 2, >=3}: accuracy and Visual
  Search / total tool calls per sample, per method, averaged over the backbones (runs) given.
- **Table 13** (D.1): HLE-VL accuracy (%), the mean over trials ("means only"), one row per method, one column per
  backbone; every run on the same manifest (its sha256, printed under the table). HLE-VL runs never enter Table 1.
"""
from __future__ import annotations

import json as _json
from pathlib import Path

import numpy as np

from agent.lazy import lazy_module
from agent.rundir import RunError, frames, load_run
from agent.rundir.grades import JUDGES, BrokenGrades, MixedJudges, grades_of, identical_trials
from agent.rundir.ledger import compute_ledger
from analysis.figures import write_csv, write_text
from analysis.pooling import (
    comparability_note,
    duplicates_note,
    refuse_mixed_protocols,
    refuse_mixed_servers,
    serving_engine,
)

pd = lazy_module("pandas")  # loads on first use: a command's --help needs none of it (agent/lazy.py)

__all__ = ["grades_of", "judged_runs", "table1", "table4", "table5", "table13", "ledger_table", "write_table", "method_label",
           "model_label", "trajectory_frame", "JUDGES", "SUPPLEMENTARY"]

#: Benchmarks reported apart from Table 1 (paper D.1: HLE-VL is Table 13, outside the seven of the main suite).
SUPPLEMENTARY = {"hle_vl": "Table 13"}

def judged_runs(run_dirs, judge: str | None = None) -> tuple[list[tuple], list[str], str]:
    """``([(run, grades)], missing, judge label)`` for a table, each run's grades as :func:`agent.rundir.frames.grades`
    gives them; refuses runs graded by different judges."""
    got, missing = [], []
    for rd in run_dirs:
        try:
            run = load_run(rd)
            g = frames.grades(run, judge)
        except BrokenGrades:  # refused, never listed as a missing run
            raise
        except RunError as e:
            missing.append(str(e))
            continue
        got.append((run, g, g["judge"].iloc[0]))
    labels = {}
    for run, _, label in got:
        labels.setdefault(label, []).append(str(run.path))
    if len(labels) > 1:
        detail = "; ".join(f"{lab}: {', '.join(paths)}" for lab, paths in labels.items())
        raise MixedJudges(f"these runs were graded by different judges ({detail}). One table, one judge: pass "
                       "--judge llm or --judge exact (runs lacking it are listed as missing), or regrade")
    return [(r, g) for r, g, _ in got], missing, next(iter(labels), "")


def method_label(run) -> str:
    return run.header.label or run.header.method or "?"


def model_label(run) -> str:
    h = run.header
    return ((h.model.served_model if h.model else None) or (run.index[0].model if run.index else None)
            or h.backend.model or "")


def _per_trial_acc(df, refused: bool = False) -> tuple[float, float | None, list[float]]:
    """Mean and std (ddof = 1) over trials in %; std None for one trial (undefined) or when refused."""
    per = [g["correct"].mean() * 100 for _, g in df.groupby("trial")]
    return float(np.mean(per)), (float(np.std(per, ddof=1)) if len(per) > 1 and not refused else None), per


def _cell(m: float, s: float | None, mark: str = "") -> str:
    return (f"{m:.1f} ± {s:.1f}" if s is not None else f"{m:.1f} ± —") + mark


#: Row order within a backbone block: the paper's Table 1 (direct inference, the baselines, ours last).
METHOD_ORDER = ("direct", "react", "agentfold", "contextfold", "mmcontextfold")


def _method_rank(label: str) -> tuple:
    base = label.split("-")[0].split(" ")[0].lower()
    return (METHOD_ORDER.index(base) if base in METHOD_ORDER else len(METHOD_ORDER), label)


def _backbone_blocks(out, num, colmap: dict):
    """Rows grouped by backbone (first appearance), the paper's method order within a block; the best and
    second-best mean per column within a block marked (bold / underline in Markdown; ``rank`` 1 / 2 in the
    CSV). Ties share a rank; a block of one method, a † cell and a "—" cell are not ranked."""
    models = list(dict.fromkeys(out["model"]))
    out = out.assign(_b=out["model"].map(models.index), _m=out["method"].map(_method_rank))
    out = out.sort_values(["_b", "_m"], kind="stable").drop(columns=["_b", "_m"]).reset_index(drop=True)
    num["rank"] = np.nan
    for model in models:
        for bench, col in colmap.items():
            cand = num[(num.model == model) & (num.benchmark == bench) & num.same_set]
            if cand["method"].nunique() < 2:
                continue
            levels = sorted(set(np.round(cand["mean"].to_numpy(dtype=float), 6)), reverse=True)
            for idx, r in cand.iterrows():
                rank = levels.index(round(float(r["mean"]), 6)) + 1
                if rank > 2:
                    continue
                num.loc[idx, "rank"] = rank
                where = (out.model == model) & (out.method == r["method"])
                cell = out.loc[where, col].iloc[0]
                out.loc[where, col] = f"**{cell}**" if rank == 1 else f"<u>{cell}</u>"
    return out


def _table1_groups(runs) -> tuple[dict, dict, dict]:
    """Runs grouped by (method, model) (one run per method, model and benchmark), their grades as frames, and each
    benchmark column's evaluated set: every sample any row graded on it, in any trial."""
    groups: dict = {}
    engines: dict = {}  # backbone -> (engine, the run that set it): its methods are ranked against each other
    for run, g in runs:
        key = (method_label(run), model_label(run))
        eng = serving_engine(run.header)
        first = engines.setdefault(key[1], (eng, run.path))
        if None not in (eng, first[0]) and eng != first[0]:
            raise RunError(f"Table 1, {key[1]}: {first[1]} was served by {first[0]} and {run.path} by {eng}; the "
                           "methods of one backbone are ranked against each other, so they come from one engine")
        benches = set(g["benchmark"])
        apart = sorted(benches & set(SUPPLEMENTARY))
        if apart:
            raise RunError(f"{run.path}: {apart[0]} is the paper's {SUPPLEMENTARY[apart[0]]} (D.1), never part of "
                           "Table 1's average: tabulate it with table13 (python -m analysis.report --runs puts it there)")
        have = groups.setdefault(key, [])
        clash = benches & {b for _, other in have for b in other["benchmark"]}
        refuse_mixed_protocols(key, [r for r, _ in have] + [run])
        refuse_mixed_servers(f"{key[0]} on {key[1]}", [r for r, _ in have] + [run])
        if clash:
            raise RunError(f"two runs of {key[0]} on {key[1]} cover {sorted(clash)}: give one run per method, "
                           f"model and benchmark ({run.path})")
        have.append((run, g))
    by_key = {key: pd.concat([g for _, g in items], ignore_index=True) for key, items in groups.items()}
    expected: dict = {}
    for df in by_key.values():
        for b, g in df.groupby("benchmark"):
            expected.setdefault(b, set()).update(g["sample_id"])
    return groups, by_key, expected


def table1(run_dirs, judge: str | None = None) -> "pd.DataFrame":
    """Table 1 (and Table 3 when given ReAct-Removal@k runs): accuracy (%) mean ± std over trials.

    The caption's rule (Table 1): the n under each benchmark is "the number of evaluated instances per
    benchmark, identical for all methods and trials". A cell whose method x trial evaluated another set of
    samples than the column's (the union over every row and trial) is marked ``†`` and named in the note. A
    std is "—" for one trial (undefined) and refused ("—", with the reason in the note) over identical trials.
    ``attrs["numeric"]`` holds the numbers (mean, std, n_trials, n, n_expected per row x benchmark): the CSV."""
    runs, missing, label = judged_runs(run_dirs, judge)
    if not runs:
        raise RunError("no judged run to tabulate: " + "; ".join(missing))
    groups, by_key, expected = _table1_groups(runs)
    rows, numeric, notes_n, notes_id = [], [], [], []
    for (method, model), df in by_key.items():
        refused = identical_trials(ln for run, _ in groups[(method, model)] for ln in run.index)
        if refused:
            notes_id.append(f"{method} / {model}: {refused}")
        row = {"method": method, "model": model}
        off_any = False
        for b in sorted(expected):
            g = df[df.benchmark == b]
            if g.empty:
                row[b] = "—"
                continue
            m, s, per = _per_trial_acc(g, refused=bool(refused))
            off = [(int(t), len(set(gt.sample_id)), len(expected[b])) for t, gt in g.groupby("trial")
                   if set(gt.sample_id) != expected[b]]
            off_any = off_any or bool(off)
            for t, n, n_exp in off:
                notes_n.append(f"{method} / {model}, {b}, trial {t}: {n} evaluated of the column's {n_exp}")
            row[b] = _cell(m, s, " †" if off else "")
            numeric.append({"method": method, "model": model, "benchmark": b, "mean": m, "std": s,
                            "n_trials": len(per), "n": int(g.groupby("trial").size().min()), "n_expected": len(expected[b]),
                            "same_set": not off, "std_refused": bool(refused)})
        m, s, per = _per_trial_acc(df, refused=bool(refused))
        row["Avg."] = _cell(m, s, " †" if off_any else "")
        row["trials"] = int(df["trial"].nunique())
        numeric.append({"method": method, "model": model, "benchmark": "Avg.", "mean": m, "std": s,
                        "n_trials": len(per), "n": int(df.groupby("trial").size().min()),
                        "n_expected": sum(len(v) for v in expected.values()), "same_set": not off_any,
                        "std_refused": bool(refused)})
        rows.append(row)
    out = pd.DataFrame(rows)
    benches = sorted(expected)
    out = out.rename(columns={b: f"{b} (n={len(expected[b])})" for b in benches})
    cols = [f"{b} (n={len(expected[b])})" for b in benches]
    out = out[["method", "model", *cols, "Avg.", "trials"]]
    num = pd.DataFrame(numeric)
    out = _backbone_blocks(out, num, dict(zip([*benches, "Avg."], [*cols, "Avg."])))
    notes = [f"Accuracy (%), mean ± std (ddof=1) over trials; Avg. weighted by sample counts. Judge: {label}. "
             "± — : one trial (a std needs two) or a refused std. Within each backbone block the best mean is "
             "**bold** and the second best <u>underlined</u> (Table 1 caption); a † cell is not ranked (ours: it "
             "was evaluated on another set)."]
    if notes_n:
        notes.append("**† evaluated on another set than the column's n** (Table 1: n is identical for all methods "
                     "and trials): " + "; ".join(notes_n) + ".")
    if notes_id:
        notes.append("**std refused:** " + "; ".join(notes_id) + ".")
    for extra in (comparability_note([r for r, _ in runs]), duplicates_note([r for r, _ in runs])):
        if extra:
            notes.append(extra)
    if missing:
        notes.append("Not included (no such judge output): " + "; ".join(missing))
    out.attrs["note"] = "\n\n".join(notes)
    out.attrs["judge"] = label
    out.attrs["missing"] = missing
    out.attrs["numeric"] = num
    out.attrs["mismatched_n"] = notes_n
    out.attrs["blocks"] = "model"  # write_table: one block per backbone, as in the paper
    return out


def trajectory_frame(run):
    s = frames.results(run)
    s = s[s.status.isin(["ok", "no_answer"])].copy()  # harness errors and timeouts are not trajectories
    for t in ("lens_search", "search", "visit"):
        col = f"tool_{t}"
        s[col] = s[col].fillna(0) if col in s else 0
    return s


def table4(run_dirs) -> "pd.DataFrame":
    """Table 4: per method and backbone, pooled over its runs (benchmarks): cumulative tokens, working context,
    tool calls by type.

    The paper averages "across five backbones and seven benchmarks" (Table 4 caption). Pooling trajectories
    of different models is only a fair comparison when every method covers the same models, so (ours) each
    (method, model) gets its own row, and a pooled row per method ("all N backbones") is added only then;
    otherwise the note says why there is none."""

    pooled: dict = {}
    for rd in run_dirs:
        run = load_run(rd)
        if run.header.method == "direct":  # Table 4 compares the agentic methods (§4.4)
            continue
        s = trajectory_frame(run)
        s["run"] = run.path.name
        pooled.setdefault((method_label(run), model_label(run)), []).append(s)

    def row(method, model, parts):
        s = pd.concat(parts, ignore_index=True)
        return {"method": method, "model": model, "runs": len(parts), "trajectories": len(s),
                "cumulative tokens": s.total_tokens.mean(), "working context": s.max_prompt_tokens.mean(),
                "LLM calls": s.n_calls.mean(), "tool calls": s.n_tool_calls.mean(),
                "Visual Search (lens_search)": s.tool_lens_search.mean(),
                "Text Retrieval (search)": s.tool_search.mean(), "Web Visit (visit)": s.tool_visit.mean(),
                # ours: calls cut by max_tokens (a cut think block forces a correction; not in the paper)
                "ended by length (% of calls)": 100.0 * s.length_calls.sum() / max(int(s.n_calls.sum()), 1)}

    keys = sorted(pooled, key=lambda k: (_method_rank(k[0]), list(dict.fromkeys(m for _, m in pooled)).index(k[1])))
    rows = [row(m, model, pooled[(m, model)]) for m, model in keys]
    covers = {}
    for m, model in keys:
        covers.setdefault(m, set()).add(model)
    models = sorted({model for _, model in keys})
    note_pool = ""
    if len(models) > 1:
        if len({frozenset(v) for v in covers.values()}) == 1:
            for m in covers:
                rows.append(row(m, f"all {len(models)} backbones (pooled)",
                                [f for (mm, _), fs in pooled.items() if mm == m for f in fs]))
            note_pool = (f" The pooled rows average over the {len(models)} backbones every method covers "
                         f"({', '.join(models)}), as the paper's Table 4 does.")
        else:
            detail = "; ".join(f"{m}: {', '.join(sorted(v))}" for m, v in covers.items())
            note_pool = (f" **Not pooled across backbones**: the methods cover different models ({detail}); "
                         "a pooled mean would compare different model mixes.")
    df = pd.DataFrame(rows)
    df.attrs["note"] = ("Means per trajectory, per method and backbone, pooled over every run given for it "
                        "(benchmarks). Cumulative tokens = prompt + completion tokens over all LLM calls; working "
                        "context = the largest prompt of any single call. Trajectories that ended in a harness "
                        "error or timeout are excluded. 'ended by length' (ours) = calls whose generation stopped "
                        "at max_tokens." + note_pool)
    return df


def ledger_table(run_dirs, prices=None) -> "pd.DataFrame":
    """Beside Table 4 (ours): what each run cost, from its cost ledger (agent/rundir/ledger.py; recomputed when the run
    has none). Unknown GPU time or money is "unknown", never 0."""



    rows = []
    for rd in run_dirs:
        run = load_run(rd)
        f = Path(rd) / "ledger.json"
        led = _json.loads(f.read_text()) if f.exists() and prices is None else compute_ledger(rd, prices=prices)
        unk = lambda v: "unknown" if v is None else v  # noqa: E731
        for model, m in led["models"].items():
            tools = led["tools"].values()
            rows.append({"run": run.path.name, "method": method_label(run), "model": model, "units": led["units"],
                         "prompt tokens": m["prompt_tokens"], "cached tokens": m["cached_tokens"],
                         "completion tokens": m["completion_tokens"],
                         "request GPU-s": unk(m["request_gpu_seconds"]), "held GPU-s": unk(m["held_gpu_seconds"]),
                         "tool calls": sum(t["calls"] for t in tools), "cached tool calls": sum(t["cached"] for t in tools),
                         "paid tool calls": sum(t["paid_calls"] for t in tools),
                         "money (USD)": unk(led["total_money"])})
    df = pd.DataFrame(rows)
    df.attrs["note"] = ("What each run cost (ours; agent/rundir/ledger.py): tokens per model; request GPU-s = latency x the "
                        "GPUs behind the endpoint, held GPU-s = the run's span x servers x GPUs (requests are batched: "
                        "the first over-counts busy time); tool calls answered from the cache and paid ones; money "
                        "from the price table (python -m agent.ledger --prices), unknown where a price or the GPUs "
                        "are unknown.")
    return df


def _image_group(n: int) -> str:
    return "1 image" if n == 1 else "2 images" if n == 2 else ">=3 images" if n >= 3 else "0 images"


def table5(run_dirs, benchmark: str = "mmsearch_plus", judge: str | None = None) -> "pd.DataFrame":
    """Table 5: accuracy (%) and Visual Search / total tool calls on MMSearch-Plus by number of query images."""

    runs, missing, label = judged_runs(run_dirs, judge)
    per_run = []
    for run, g in runs:
        df = g[g["benchmark"] == benchmark][["sample_id", "trial", "correct"]]
        if df.empty:
            continue
        res = frames.results(run)
        if "tool_lens_search" not in res:
            res["tool_lens_search"] = 0
        res = res[["sample_id", "trial", "n_query_images", "tool_lens_search", "n_tool_calls"]]
        df = df.merge(res, on=["sample_id", "trial"], how="left").fillna(
            {"n_query_images": 0, "tool_lens_search": 0, "n_tool_calls": 0})
        df = df.rename(columns={"n_query_images": "n_images", "tool_lens_search": "vs", "n_tool_calls": "tools"})
        df["group"] = df["n_images"].astype(int).map(_image_group)
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


def table13(run_dirs, judge: str | None = None) -> "pd.DataFrame":
    """Table 13 (D.1): HLE-VL accuracy (%), each entry the mean over the run's trials (the caption: "the mean over
    three independent runs"; no std), one row per method, one column per backbone. Refused: a run on another
    benchmark, or runs drawn from different HLE-VL files (their manifests' sha256 differ); the sha256 is printed
    under the table, to be checked against WebWatcher's released file (which cannot be read here)."""
    runs, missing, label = judged_runs(run_dirs, judge)
    if not runs:
        raise RunError("no judged HLE-VL run to tabulate: " + "; ".join(missing))
    digests: dict = {}
    rows: dict = {}
    for run, g in runs:
        benches = sorted(set(g["benchmark"]))
        if benches != ["hle_vl"]:
            raise RunError(f"{run.path}: Table 13 is HLE-VL only (paper D.1); this run is on {', '.join(benches)}")
        digests.setdefault(run.header.benchmark_sha256, []).append(str(run.path))
        refuse_mixed_protocols((method_label(run), model_label(run)), [run])
        m, _, per = _per_trial_acc(g)
        row = rows.setdefault(method_label(run), {"method": method_label(run)})
        if model_label(run) in row:
            raise RunError(f"two HLE-VL runs of {method_label(run)} on {model_label(run)}: give one ({run.path})")
        row[model_label(run)] = round(m, 1)
        row.setdefault("_trials", set()).add(len(per))
    if None in digests or len(digests) > 1:
        detail = "; ".join(f"{d or 'not recorded'}: {', '.join(p)}" for d, p in digests.items())
        raise RunError(f"Table 13 needs every run on one HLE-VL file; the manifests differ ({detail})")
    models = list(dict.fromkeys(model_label(r) for r, _ in runs))
    out = pd.DataFrame([{k: v for k, v in r.items() if k != "_trials"} for r in rows.values()])
    out = out.assign(_m=out["method"].map(_method_rank)).sort_values("_m").drop(columns="_m").reset_index(drop=True)
    out = out[["method", *models]]
    trials = sorted({t for r in rows.values() for t in r["_trials"]})
    digest = next(iter(digests))
    out.attrs["note"] = (f"HLE-VL accuracy (%), the mean over {'/'.join(map(str, trials))} trial(s) per entry (Table 13 "
                         f"reports means only). Judge: {label}. Manifest sha256: {digest} (check it against "
                         "WebWatcher's released 330-question file; this toolkit cannot fetch it). Never pooled into "
                         "Table 1.")
    if missing:
        out.attrs["note"] += "\n\nNot included (no such judge output): " + "; ".join(missing)
    out.attrs["judge"], out.attrs["missing"], out.attrs["manifest_sha256"] = label, missing, digest
    return out


def write_table(df, stem) -> list[Path]:
    """``stem.md`` (with the note) and ``stem.csv``."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    block = df.attrs.get("blocks")
    cols = [c for c in df.columns if c != block]
    body = []
    for i, row in enumerate(df.itertuples(index=False)):
        d = dict(zip(df.columns, row))
        if block and (i == 0 or d[block] != df.iloc[i - 1][block]):  # a backbone's block header, as in the paper
            body.append("| " + " | ".join([f"*{d[block] or '?'}*", *[""] * (len(cols) - 1)]) + " |")
        body.append("| " + " | ".join(f"{d[c]:.1f}" if isinstance(d[c], float) else str(d[c]) for c in cols) + " |")
    md = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols), *body]
    if df.attrs.get("note"):
        md = [df.attrs["note"], "", *md]
    write_text(stem.with_suffix(".md"), "\n".join(md) + "\n")
    # the CSV holds numbers (a table's display strings, "mean ± std", live in the .md only)
    numeric = df.attrs.get("numeric")
    write_csv(numeric if numeric is not None else df, stem.with_suffix(".csv"), index=False)
    return [stem.with_suffix(".md"), stem.with_suffix(".csv")]
