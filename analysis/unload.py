"""The data of the unloading figure (ours; ``--image-unload adaptive``, agent/methods/unload.py).

    from analysis.unload import unload_points, unload_steps
    pts = unload_points(full_and_removal_runs, adaptive_runs, react_runs=probed_react_runs, judge="exact")
    hist = unload_steps(adaptive_runs)

``unload_points``: one row per policy — ReAct with the images kept, each fixed ReAct-Removal@k (from
``--remove-images-from-step`` runs, and from the removal probe's replays of a probed ReAct run), and each
adaptive run (its ε and M) — with its accuracy (%), the number of trajectories, and what it kept: the query
images in context summed over the calls (``image_steps``, per trajectory) and the working context (the
largest prompt, tokens). One judge and one model per figure: points graded by different judges, or made
by different models, are refused with the runs named (a Pareto picture across models would compare
nothing).

``unload_steps``: one row per adaptive trajectory: its paper category, detection step and unload step
(NaN when the images were never unloaded).
"""
from __future__ import annotations

import json

import numpy as np

from agent.lazy import lazy_module
from agent.record import LineSummary
from agent.rundir import RunError, frames, load_run

from . import tables

pd = lazy_module("pandas")  # loads on first use: a command's --help needs none of it (agent/lazy.py)

__all__ = ["unload_points", "unload_steps"]


def _kept(line: LineSummary) -> tuple[int, int]:
    """(query images sent over the calls, the largest prompt): the images kept and the working context."""
    return (sum(c.n_query_images for c in line.calls), max((c.prompt_tokens for c in line.calls), default=0))


def _kind(run) -> tuple[str, dict]:
    h = run.header
    if h.image_unload:
        ir = h.image_unload
        return "adaptive", {"threshold": ir.get("threshold"), "patience": ir.get("patience"), "signal": ir.get("signal"),
                            "label": f"adaptive {ir.get('signal')} ε={ir.get('threshold'):g}, M={ir.get('patience')}"}
    if h.remove_images_from_step is not None:
        k = h.remove_images_from_step
        return "R@k (runs)", {"k": k, "label": f"R@{k}"}
    if h.method == "react" and not h.variant:
        return "ReAct (images kept)", {"label": "ReAct"}
    raise RunError(f"{run.path}: the unloading figure compares ReAct, ReAct-Removal@k and adaptive ReAct runs; "
                   f"this one is {h.label}")


def unload_points(runs=(), adaptive=(), *, react_runs=(), judge: str | None = None):
    all_runs = list(dict.fromkeys([*map(str, runs), *map(str, adaptive)]))
    judged, missing, label = tables.judged_runs(all_runs, judge)
    rows = []
    models = {}
    for run, g in judged:
        kind, info = _kind(run)
        ok = dict(zip(zip(g["sample_id"], g["trial"]), g["correct"]))
        kept = [_kept(ln) for ln in run.index if ln.key in ok]
        corr = [ok[ln.key] for ln in run.index if ln.key in ok]
        models.setdefault(tables.model_label(run), []).append(str(run.path))
        rows.append({"series": kind, **info, "accuracy": 100.0 * float(np.mean(corr)) if corr else np.nan,
                     "n": len(corr), "image_steps": float(np.mean([k[0] for k in kept])) if kept else np.nan,
                     "working_context": float(np.mean([k[1] for k in kept])) if kept else np.nan,
                     "run": str(run.path)})
    for rd in react_runs:
        run = load_run(rd)
        pdir = run.path / "probes" / "removal"
        if not (pdir / "outcomes.csv").exists():
            missing.append(f"unloading figure: no removal replays of {rd} (python -m probes.removal {rd})")
            continue
        probe = json.loads((pdir / "probe.json").read_text()) if (pdir / "probe.json").exists() else {}
        if label and probe.get("judge") and probe["judge"] != label:
            raise RunError(f"the removal replays of {rd} were graded by {probe['judge']!r}, the runs by {label!r}: "
                           "one judge per figure (rerun python -m probes.removal with the same judge)")
        label = label or probe.get("judge", "")
        models.setdefault(tables.model_label(run), []).append(str(run.path))
        o = frames.removal(run.path)  # as sealed, of lines the run holds now
        # complete pairs only: a failed replay is missing, never a wrong answer; unreplayed = ended before k
        o = o[(o["replayed"].astype(bool) & o["replay_status"].isin(["ok", "no_answer"]) & o["error"].isna())
              | ~o["replayed"].astype(bool)]
        orig = {ln.key: ln for ln in run.index}
        for k, g in o.groupby("k"):
            kd = pdir / f"k{int(k)}"
            rep = {ln.key: ln for ln in load_run(kd).index} if (kd / "header.json").exists() else {}
            kept, corr = [], []
            for r in g.itertuples():
                key = (r.sample_id, int(r.trial))
                ln = rep.get(key) if bool(r.replayed) else orig.get(key)
                if ln is None:
                    continue
                kept.append(_kept(ln))
                corr.append(bool(r.replay_correct) if bool(r.replayed) else bool(r.original_correct))
            rows.append({"series": "R@k (replays)", "k": int(k), "label": f"R@{int(k)}",
                         "accuracy": 100.0 * float(np.mean(corr)) if corr else np.nan, "n": len(corr),
                         "image_steps": float(np.mean([x[0] for x in kept])) if kept else np.nan,
                         "working_context": float(np.mean([x[1] for x in kept])) if kept else np.nan, "run": str(kd)})
    if len(models) > 1:
        raise RunError("the unloading figure compares policies of one model; these runs are of "
                       + "; ".join(f"{m or '?'}: {', '.join(p)}" for m, p in models.items())
                       + " (make one report per model)")
    df = pd.DataFrame(rows)
    df.attrs.update({"judge": label, "missing": missing, "model": next(iter(models), "")})
    return df


def unload_steps(adaptive=()):
    rows = []
    for rd in adaptive:
        run = load_run(rd)
        ir = run.header.image_unload
        if not ir:
            raise RunError(f"{rd}: not an adaptive run (python -m agent.run --method react --image-unload adaptive)")
        name = f"ε={ir['threshold']:.3g}, M={ir['patience']} ({ir['signal']})"
        for ln in run.index:
            s = ln.image_unload
            rows.append({"run": str(run.path), "policy": name, "calibrated": str(ir.get("threshold_source", "")).startswith("calibrated"),
                         "sample_id": ln.sample_id, "trial": ln.trial, "paper_category": ln.paper_category,
                         "status": ln.status, "n_calls": ln.n_calls,
                         "detect_step": s.detect_step if s else None, "unload_step": s.unload_step if s else None,
                         "probes": s.probes if s else None, "scoring_calls": s.scoring_calls if s else None,
                         "probe_seconds": s.probe_seconds if s else None})
    df = pd.DataFrame(rows)
    for c in ("detect_step", "unload_step"):
        if c in df:
            df[c] = pd.to_numeric(df[c], errors="coerce")
    return df
