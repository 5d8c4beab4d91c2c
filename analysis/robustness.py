"""Is the paper's finding robust? Beyond the paper (ours, issue 85): Figure 2(b)'s ΔH under every reasonable
aggregation of a step's token entropies, and which signal predicts a correct answer.

    from analysis.robustness import robustness, verdicts, predictors
    rob = robustness(frames.entropy(RUN))           # per step, category and aggregation: n, mean ΔH, CI, p, sign
    verdicts(rob)                                   # per step: does ΔH's sign (and significance) hold under all?
    predictors([RUN], judge="llm")                  # per model and benchmark: AUROC of each signal for CORRECT

Aggregations (analysis/estimators/entropy.py ``AGGREGATIONS``; computed by the entropy probe from each step's tokens, both
sides the same way): the paper's mean over the think tokens (B.4), the median, the 10 % trimmed mean, the first and
the last 32 think tokens, the maximum, the exact entropy of the top-20 alone (no tail bin), and the mean over the
whole generated segment (thinking and answer). Each with a 95 % BCa bootstrap CI and Wilcoxon p over the steps.

Predictors of the judge's grade, per trajectory: answer agreement across trials (the share of the sample's other
trials whose answer is the same, normalised; needs two trials or more, Wang et al. 2022's self-consistency), the
mean think entropy (grouped tail, over the trajectory's think tokens; lower predicts CORRECT, so its AUROC is of
-H), and the trajectory's mean ΔH over its probed steps (as measured: 0.5 is no signal). AUROC with a bootstrap CI.
Both read the run and the probes through the one reader (agent/rundir/frames.py), which refuses what the record refuses.
"""
from __future__ import annotations

import re

import numpy as np

from agent.lazy import lazy_module
from agent.rundir import RunError, frames, load_run
from agent.rundir.grades import BrokenGrades, MixedJudges, grades_of

from .estimators.entropy import AGGREGATIONS, EDGE_TOKENS, TRIM
from .estimators.stats import auroc, auroc_ci, bootstrap_ci, wilcoxon_p

pd = lazy_module("pandas")  # loads on first use: a command's --help needs none of it (agent/lazy.py)

__all__ = ["robustness", "verdicts", "predictors", "predictor_table", "AGGREGATION_LABELS", "SIGNIFICANCE",
           "PREDICTORS"]

#: What each aggregation is, as a table and a figure name it.
AGGREGATION_LABELS = {"mean": "mean of think tokens (paper, B.4)", "median": "median of think tokens",
                      "trimmed": f"{int(TRIM * 100)}% trimmed mean", "first": f"first {EDGE_TOKENS} think tokens",
                      "last": f"last {EDGE_TOKENS} think tokens", "max": "maximum over think tokens",
                      "top20_exact": "exact top-20 entropy (no tail bin)", "whole": "whole generated segment"}
#: The level a ΔH is called significant at (its bootstrap CI excludes 0 and its Wilcoxon p is below it).
SIGNIFICANCE = 0.05


def robustness(steps) -> "pd.DataFrame":
    """Per step, paper category (and ``All``) and aggregation: n, mean ΔH, 95 % bootstrap CI, Wilcoxon p, the sign
    of the mean (+1 / -1 / 0) and whether it is significant. RunError when the probe recorded no aggregations (a
    probe from before they were: rerun it)."""
    cols = [f"dH_agg_{a}" for a in AGGREGATIONS]
    if not set(cols) <= set(steps.columns):
        raise RunError("the entropy probe's rows hold no aggregations (written by an older version): rerun python -m "
                       "probes.entropy RUN on a fresh output (--out) to compute them")
    rows = []
    cats = [("All", steps)] + [(c, g) for c, g in steps.groupby("paper_category", sort=True)]
    for cat, g in cats:
        for step, gs in g.groupby("step", sort=True):
            for a in AGGREGATIONS:
                v = gs[f"dH_agg_{a}"].to_numpy(dtype=float)
                v = v[np.isfinite(v)]
                lo, hi = bootstrap_ci(v, reps=1000)
                p = wilcoxon_p(v)
                mean = float(v.mean()) if len(v) else float("nan")
                sig = bool(len(v) and np.isfinite(lo) and (lo > 0 or hi < 0) and np.isfinite(p) and p < SIGNIFICANCE)
                rows.append({"step": int(step), "category": cat, "aggregation": a, "n": len(v), "mean": mean,
                             "ci_low": lo, "ci_high": hi, "wilcoxon_p": p,
                             "sign": int(np.sign(mean)) if np.isfinite(mean) else 0, "significant": sig})
    return pd.DataFrame(rows)


def verdicts(rob, category: str = "All") -> "pd.DataFrame":
    """Per step (of ``category``): whether the sign of ΔH and its significance under the paper's aggregation hold
    under every other, and a one-line verdict naming the aggregations where they do not."""
    out = []
    for step, g in rob[rob["category"] == category].groupby("step", sort=True):
        by = g.set_index("aggregation")
        if "mean" not in by.index or not by.loc["mean", "n"]:
            continue
        sign, sig = int(by.loc["mean", "sign"]), bool(by.loc["mean", "significant"])
        flips = [a for a in by.index if by.loc[a, "n"] and int(by.loc[a, "sign"]) != sign]
        sig_diff = [a for a in by.index if by.loc[a, "n"] and bool(by.loc[a, "significant"]) != sig]
        holds = not flips and not sig_diff
        what = f"ΔH {'>' if sign > 0 else '<' if sign < 0 else '='} 0" + (" (significant)" if sig else "")
        verdict = (f"{what}: holds under all {len(by)} aggregations" if holds else
                   f"{what} under the paper's mean; " + "; ".join(
                       x for x in ((f"the sign flips under {', '.join(flips)}" if flips else ""),
                                   (f"significance differs under {', '.join(sig_diff)}" if sig_diff else "")) if x))
        out.append({"step": int(step), "category": category, "n": int(by.loc["mean", "n"]), "holds": holds,
                    "sign_flips": ",".join(flips), "significance_differs": ",".join(sig_diff), "verdict": verdict})
    return pd.DataFrame(out)


def _normalised(answer) -> str:
    return re.sub(r"\s+", " ", str(answer or "")).strip().lower().rstrip(".")


def _trajectories(rd, judge: str | None) -> "pd.DataFrame":
    """One row per graded trajectory of a run: its grade, answer agreement, mean think entropy and mean ΔH."""
    run = load_run(rd)
    recs, label = grades_of(run.path, judge)
    grade = {(r.sample_id, r.trial): r.grade == "CORRECT" for r in recs}
    rows = [{"sample_id": ln.sample_id, "trial": ln.trial, "benchmark": ln.benchmark,
             "answer": _normalised(ln.answer)} for ln in run.index]
    t = pd.DataFrame(rows)
    t["correct"] = [grade.get(k) for k in zip(t["sample_id"], t["trial"])]
    t = t[t["correct"].notna()].copy()
    same = t.groupby(["sample_id", "answer"])["trial"].transform("size") - 1
    others = t.groupby("sample_id")["trial"].transform("size") - 1
    t["agreement"] = np.where(others > 0, same / others.where(others > 0, 1), np.nan)
    e = frames.step_entropies(run)
    if len(e):
        e = e[e["n_think"] > 0].assign(w=lambda d: d["H"] * d["n_think"])
        h = e.groupby(["sample_id", "trial"]).agg(w=("w", "sum"), n=("n_think", "sum"))
        t = t.merge((h["w"] / h["n"]).rename("think_entropy").reset_index(), on=["sample_id", "trial"], how="left")
    else:
        t["think_entropy"] = np.nan
    try:
        d = frames.entropy(rd)
        dh = d.groupby(["sample_id", "trial"])["dH"].mean().rename("dH").reset_index()
        t = t.merge(dh, on=["sample_id", "trial"], how="left")
    except frames.NoProbeOutput:
        t["dH"] = np.nan
    t["model"] = run.header.model.served_model if run.header.model else None
    t["judge"] = label
    return t


#: Each predictor, and the score its AUROC is of (oriented so that above 0.5 predicts CORRECT where a direction
#: is expected; ΔH as measured).
PREDICTORS = {"agreement across trials": ("agreement", 1.0), "mean think entropy (-H)": ("think_entropy", -1.0),
              "mean ΔH over probed steps": ("dH", 1.0)}


def predictors(runs, judge: str | None = None, missing: list | None = None) -> "pd.DataFrame":
    """Per model, benchmark and predictor: n trajectories, AUROC for the judge's CORRECT with a 95 % bootstrap CI,
    and a note where it cannot be computed (one trial: no agreement; no probe: no ΔH). Runs graded by different
    judges are refused (:class:`MixedJudges`); with ``missing``, a run lacking the judge asked for is listed there."""
    parts = []
    for rd in runs:
        try:
            parts.append(_trajectories(rd, judge))
        except (BrokenGrades, MixedJudges):  # grades that cannot be counted stop the table
            raise
        except RunError as e:  # a run without the judge asked for: listed, as the tables list it
            if missing is None:
                raise
            missing.append(f"predictors: {e}")
    if not parts:  # every run lacked the judge asked for (each listed in missing)
        return pd.DataFrame()
    t = pd.concat(parts, ignore_index=True)
    labels = sorted(set(t["judge"].dropna()))
    if len(labels) > 1:  # one table, one judge (as every table of the report)
        raise MixedJudges(f"these runs were graded by different judges ({'; '.join(labels)}). One table, one judge: "
                          "pass --judge llm or --judge exact, or regrade")
    return predictor_table(t)


def predictor_table(t) -> "pd.DataFrame":
    """:func:`predictors` from a trajectory table (one row per graded trajectory: ``model``, ``benchmark``,
    ``sample_id``, ``trial``, ``correct`` and each predictor's column)."""
    out = []
    for (model, bench), g in t.groupby(["model", "benchmark"], sort=True, dropna=False):
        trials = int(g.groupby("sample_id")["trial"].nunique().max()) if len(g) else 0
        for name, (col, sign) in PREDICTORS.items():
            x = sign * g[col].to_numpy(dtype=float)
            y = g["correct"].to_numpy(dtype=bool)
            note = ""
            if col == "agreement" and trials < 2:
                note = "one trial per sample: agreement cannot be computed (run with --trials 3, as the paper)"
            elif not np.isfinite(x).any():
                note = "no values (run the entropy probe)" if col == "dH" else "no values"
            elif y.all() or not y.any():
                note = "every answer graded the same: nothing to predict"
            a = auroc(x, y) if not note else float("nan")
            lo, hi = auroc_ci(x, y) if not note else (float("nan"), float("nan"))
            out.append({"model": model, "benchmark": bench, "predictor": name, "n": int(np.isfinite(x).sum()),
                        "auroc": a, "ci_low": lo, "ci_high": hi, "note": note})
    return pd.DataFrame(out)
