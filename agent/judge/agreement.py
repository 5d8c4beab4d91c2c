"""Two judges of one run, compared (ours; issue 26): ``python -m agent.judge agree RUN [--judges A B]``.

    python -m agent.judge RUN                                            # the paper's judge -> judge-llm.jsonl
    python -m agent.judge RUN --judge-endpoint http://gpu:30002 --judge-model qwen3.5-27b --judge-name qwen27b
    python -m agent.judge agree RUN --judges llm qwen27b

Judge drift (a preview model rerouted, a judge swapped for a local one) is measured instead of suspected: per
benchmark and overall, on the units both judges graded for the same answer,

- **Cohen's κ** over the grade labels (CORRECT / INCORRECT / NOT_ATTEMPTED / UNPARSED): (p_o − p_e) / (1 − p_e),
  with p_e from each judge's own label frequencies (Cohen 1960); undefined (null) when both judges give one
  label to everything (p_e = 1);
- the **confusion matrix** (rows: judge A's grade, columns: judge B's);
- the **accuracy difference** A − B (accuracy = CORRECT / units, as Table 1) with a 95 % BCa bootstrap CI (scipy.stats.bootstrap)
  over units, paired (one resample of units scores both judges), 2,000 resamples, fixed seed.

Refused (exit 2), before any number: a judge file holding several judges or a rerouted judge (as the tables
refuse), units graded by one judge only (grade them with both; ``--common-only`` compares the rest and says how
many were left out), and a unit whose two grades are of different answers (one is stale: rerun the judge).
Written beside the run: ``judge-agreement-A-vs-B.json`` and ``.md``.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from analysis.estimators.stats import bootstrap_ci

from ..cli import done
from ..rundir import RunError
from ..rundir.grades import grades_of

log = logging.getLogger(__name__)

__all__ = ["cohen_kappa", "agreement", "agree_command", "LABELS"]

LABELS = ("CORRECT", "INCORRECT", "NOT_ATTEMPTED", "UNPARSED")
BOOTSTRAP = 2000


def cohen_kappa(a: list[str], b: list[str]) -> float | None:
    """Cohen's κ of two raters' labels of the same items (None when chance agreement is 1)."""
    n = len(a)
    if n == 0:
        return None
    labels = sorted(set(a) | set(b))
    po = sum(x == y for x, y in zip(a, b)) / n
    pe = sum((a.count(k) / n) * (b.count(k) / n) for k in labels)
    return None if pe >= 1.0 else (po - pe) / (1.0 - pe)


def _grades(run_dir: Path, name: str) -> dict:
    recs, label = grades_of(run_dir, name)  # refuses a mixed or rerouted judge file
    return {"label": label, "recs": {(r.sample_id, r.trial): r for r in recs}}


def _block(units: list, A: dict, B: dict, seed: int) -> dict:
    ga = [A[u].grade for u in units]
    gb = [B[u].grade for u in units]
    ca = np.array([g == "CORRECT" for g in ga], float)
    cb = np.array([g == "CORRECT" for g in gb], float)
    n = len(units)
    conf = {x: {y: sum(1 for p, q in zip(ga, gb) if p == x and q == y) for y in LABELS} for x in LABELS}
    diff = float(ca.mean() - cb.mean()) * 100 if n else None
    lo = hi = None
    if n > 1:  # paired: the difference of the means is the mean of the per-unit differences
        lo, hi = bootstrap_ci((ca - cb) * 100, reps=BOOTSTRAP, seed=seed)
    return {"units": n, "kappa": cohen_kappa(ga, gb), "agreement": sum(x == y for x, y in zip(ga, gb)) / n if n else None,
            "accuracy_a": float(ca.mean()) * 100 if n else None, "accuracy_b": float(cb.mean()) * 100 if n else None,
            "accuracy_diff": diff, "diff_ci95": [lo, hi], "confusion": conf}


def agreement(run_dir, a: str, b: str, *, common_only: bool = False, seed: int = 0) -> dict:
    run_dir = Path(run_dir)
    A, B = _grades(run_dir, a), _grades(run_dir, b)
    if A["label"] == B["label"]:
        raise RunError(f"judge-{a}.jsonl and judge-{b}.jsonl were graded by the same judge ({A['label']}): nothing to "
                       "compare")
    ka, kb = set(A["recs"]), set(B["recs"])
    only = {a: sorted(ka - kb), b: sorted(kb - ka)}
    if (only[a] or only[b]) and not common_only:
        detail = "; ".join(f"{len(v)} graded by {k} only (first: {v[0][0]} trial {v[0][1]})" for k, v in only.items() if v)
        raise RunError(f"{run_dir}: the judges graded different units ({detail}). Grade them with both judges, or "
                       "pass --common-only to compare the units both graded (the rest is reported as left out)")
    units = sorted(ka & kb)
    stale = [u for u in units if A["recs"][u].answer_key != B["recs"][u].answer_key]
    if stale:
        raise RunError(f"{run_dir}: {len(stale)} unit(s) were graded for different answers by the two judges (first: "
                       f"{stale[0][0]} trial {stale[0][1]}): one judge's grade is stale. Rerun python -m agent.judge "
                       "for both judges, then compare")
    if not units:
        raise RunError(f"{run_dir}: no unit graded by both judges")
    benches = sorted({A["recs"][u].benchmark or "?" for u in units})
    out: dict = {"run_dir": str(run_dir), "judge_a": {"name": a, "label": A["label"]}, "judge_b": {"name": b, "label": B["label"]},
           "left_out": {k: len(v) for k, v in only.items()}, "bootstrap": {"resamples": BOOTSTRAP, "seed": seed},
           "benchmarks": {}}
    for bench in benches:
        us = [u for u in units if (A["recs"][u].benchmark or "?") == bench]
        out["benchmarks"][bench] = _block(us, A["recs"], B["recs"], seed)
    out["all"] = _block(units, A["recs"], B["recs"], seed)
    return out


def _fmt(x, nd=3) -> str:
    return "n/a" if x is None else f"{x:.{nd}f}"


def markdown(rep: dict) -> str:
    a, b = rep["judge_a"], rep["judge_b"]
    md = [f"Judge agreement on {rep['run_dir']}: A = {a['label']} ({a['name']}), B = {b['label']} ({b['name']}). "
          f"Accuracy = CORRECT / units (Table 1); the difference A - B in points with a paired BCa bootstrap "
          f"95% CI ({rep['bootstrap']['resamples']} resamples of units).", "",
          "| benchmark | units | Cohen's kappa | raw agreement | acc A | acc B | A - B | 95% CI |", "|---|---|---|---|---|---|---|---|"]
    for name, blk in [*rep["benchmarks"].items(), ("All", rep["all"])]:
        lo, hi = blk["diff_ci95"]
        md.append(f"| {name} | {blk['units']} | {_fmt(blk['kappa'])} | {_fmt(blk['agreement'])} | "
                  f"{_fmt(blk['accuracy_a'], 1)} | {_fmt(blk['accuracy_b'], 1)} | {_fmt(blk['accuracy_diff'], 1)} | "
                  f"[{_fmt(lo, 1)}, {_fmt(hi, 1)}] |")
    conf = rep["all"]["confusion"]
    md += ["", "Confusion (all units; rows: A, columns: B):", "", "| A \\ B | " + " | ".join(LABELS) + " |",
           "|---|" + "---|" * len(LABELS)]
    md += [f"| {x} | " + " | ".join(str(conf[x][y]) for y in LABELS) + " |" for x in LABELS]
    if any(rep["left_out"].values()):
        md += ["", "Left out (--common-only): " + ", ".join(f"{v} graded by {k} only" for k, v in rep["left_out"].items())]
    return "\n".join(md) + "\n"


def agree_command(a) -> int:
    """``python -m agent.judge agree`` once its arguments parse (agent/judge/cli.py holds its flags)."""
    run = Path(a.run_dir)
    names = a.judges
    if names is None:
        found = sorted(p.name[len("judge-"):-len(".jsonl")] for p in run.glob("judge-*.jsonl"))
        if len(found) != 2:
            log.error(f"error: {run}: {len(found)} judges' grades found ({', '.join(found) or 'none'}); name two with "
                      "--judges A B")
            return 2
        names = found
    try:
        rep = agreement(run, *names, common_only=a.common_only, seed=a.seed)
    except RunError as e:
        log.error(f"error: {e}")
        return 2
    stem = run / f"judge-agreement-{names[0]}-vs-{names[1]}"
    Path(f"{stem}.json").write_text(json.dumps(rep, indent=2))
    md = markdown(rep)
    Path(f"{stem}.md").write_text(md)
    print(md)
    done([f"{stem}.json", f"{stem}.md"], f"python -m analysis.report --runs {run} --judge {names[0]}")
    return 0
