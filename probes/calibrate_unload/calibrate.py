"""The work of ``python -m probes.calibrate_unload`` once its arguments parse: probes/calibrate_unload/cli.py holds the flags, the
package's docstring says what it does and writes."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from agent.cli import done
from agent.errors import ToolkitError
from agent.lazy import lazy_module
from agent.methods.unload import SIGNALS, influence_of
from agent.rundir import RunError, load_run, write_json
from agent.rundir.probe_outputs import check_sources, read_table

pd = lazy_module("pandas")  # loads on first use: a command's --help needs none of it (agent/lazy.py)

log = logging.getLogger(__name__)

__all__ = ["calibrate", "labelled_steps", "simulate", "calibrate_command"]


def _read_inputs(run_dir: Path):
    ent = run_dir / "probes" / "entropy-teacher-forced" / "steps.parquet"
    rem = run_dir / "probes" / "removal" / "outcomes.csv"
    missing = []
    if not ent.exists():
        missing.append(f"the teacher-forced influences ({ent}): python -m probes.entropy {run_dir} --mode teacher-forced")
    if not rem.exists():
        missing.append(f"the removal replays ({rem}): python -m probes.removal {run_dir} --steps 1..5")
    if missing:
        raise RunError("calibration needs " + "; and ".join(missing))
    # read as the probes sealed them, and only of lines the run holds now (agent/rundir/probe_outputs.py)
    steps = check_sources(read_table(ent.parent, ("steps",)), run_dir, f"{ent.parent}/steps", "probes.entropy")
    outcomes = check_sources(read_table(rem.parent, ("outcomes",)), run_dir, f"{rem.parent}/outcomes", "probes.removal")
    probe = json.loads((run_dir / "probes" / "removal" / "probe.json").read_text()) \
        if (run_dir / "probes" / "removal" / "probe.json").exists() else {}
    return steps, outcomes, probe


def labelled_steps(steps, outcomes, signal: str):
    """One row per (trajectory, step t) with its influence and, where k = t+1 was replayed, whether removal
    from t+1 changed the outcome (``needed``)."""

    s = steps[["sample_id", "trial", "paper_category", "step", "kl_with_without", "dH"]].copy()
    s["influence"] = [influence_of(signal, k, d) for k, d in zip(s["kl_with_without"], s["dH"])]
    o = outcomes.copy()
    complete = o["replayed"].astype(bool) & o["replay_status"].isin(["ok", "no_answer"]) & o["error"].isna()
    o = o[complete]
    o = o.assign(step=o["k"] - 1, needed=(o["original_correct"].astype(bool) != o["replay_correct"].astype(bool)))
    out = s.merge(o[["sample_id", "trial", "step", "needed"]], on=["sample_id", "trial", "step"], how="left")
    return pd.DataFrame(out)


def _youden(values: np.ndarray, needed: np.ndarray) -> list[dict]:
    vals = np.unique(values[np.isfinite(values)])
    cands = np.r_[vals[0] / 2 if len(vals) and vals[0] > 0 else 0.0,
                  (vals[:-1] + vals[1:]) / 2 if len(vals) > 1 else [], vals[-1] * 1.5 + 1e-9 if len(vals) else []]
    rows = []
    n_need, n_done = int(needed.sum()), int((~needed).sum())
    for eps in cands:
        tpr = float(((values >= eps) & needed).sum() / n_need) if n_need else float("nan")
        tnr = float(((values < eps) & ~needed).sum() / n_done) if n_done else float("nan")
        rows.append({"threshold": float(eps), "tpr": tpr, "tnr": tnr, "J": tpr + tnr - 1})
    return rows


def simulate(steps, outcomes, run, signal: str, threshold: float, patience: int) -> dict:
    """The policy's estimated accuracy and image steps on the recorded trajectories (see the module doc)."""
    o = outcomes[outcomes["replayed"].astype(bool) & outcomes["replay_status"].isin(["ok", "no_answer"])
                 & outcomes["error"].isna()]
    replay = {(r.sample_id, int(r.trial), int(r.k)): bool(r.replay_correct) for r in o.itertuples()}
    original = {(r.sample_id, int(r.trial)): bool(r.original_correct) for r in outcomes.itertuples()}
    infl = {}
    for r in steps.itertuples():
        infl.setdefault((r.sample_id, int(r.trial)), {})[int(r.step)] = influence_of(signal, r.kl_with_without, r.dH)
    img_steps = {ln.key: [c.n_query_images for c in ln.calls] for ln in run.index}
    correct, kept, rel, uncovered = [], [], [], 0
    for key, orig in original.items():
        calls = img_steps.get(key, [])
        streak, r = 0, None
        for t in sorted(infl.get(key, {})):
            v = infl[key][t]
            if np.isfinite(v):
                streak = streak + 1 if v < threshold else 0
            if streak >= patience:
                r = t + 1
                break
        if r is None or r > len(calls):
            outcome = orig
        elif (key[0], key[1], r) in replay:
            outcome = replay[(key[0], key[1], r)]
        else:
            uncovered += 1
            continue
        correct.append(outcome)
        kept.append(sum(calls[: (r - 1) if r else len(calls)]))
        rel.append(r if r is not None and r <= len(calls) else np.nan)
    n = len(correct)
    return {"threshold": threshold, "patience": patience, "n": n, "uncovered": uncovered,
            "est_accuracy": 100.0 * float(np.mean(correct)) if n else float("nan"),
            "mean_image_steps": float(np.mean(kept)) if n else float("nan"),
            "unloaded_share": float(np.mean(np.isfinite(rel))) if n else float("nan"),
            "mean_release_step": float(np.nanmean(rel)) if n and np.isfinite(rel).any() else float("nan")}


def calibrate(run_dir, *, signal: str = "kl", patience=(1, 2, 3), out_dir=None) -> dict:
    if signal not in SIGNALS:
        raise ValueError(f"--signal must be one of {SIGNALS}")
    run = load_run(run_dir)
    if run.header.method != "react" or run.header.variant:
        raise RunError(f"{run.path}: calibration reads a plain ReAct run (images kept at every step); this run is "
                       f"{run.header.label}")
    steps, outcomes, probe = _read_inputs(run.path)
    lab = labelled_steps(steps, outcomes, signal)
    known = lab[lab["needed"].notna() & np.isfinite(lab["influence"])]
    needed = known["needed"].astype(bool).to_numpy()
    if len(known) == 0 or needed.all() or not needed.any():
        raise RunError(f"{run.path}: {len(known)} labelled steps, {int(needed.sum())} where removal changed the outcome: "
                       "both kinds are needed to place a threshold (more trajectories, or more k in the removal probe)")
    ys = _youden(known["influence"].to_numpy(dtype=float), needed)
    best_j = max(r["J"] for r in ys)
    best = min((r for r in ys if r["J"] >= best_j - 1e-12), key=lambda r: r["threshold"])
    grid = []
    for y in ys:
        for m in patience:
            grid.append({**y, **simulate(steps, outcomes, run, signal, y["threshold"], int(m))})
    g = pd.DataFrame(grid)
    # fully covered estimates first: one that leaves trajectories out is not comparable (it drops exactly the
    # long ones); then accuracy, then fewer image steps
    at = g[np.isclose(g["threshold"], best["threshold"])].sort_values(["uncovered", "est_accuracy", "mean_image_steps"],
                                                                     ascending=[True, False, True])
    chosen = at.iloc[0].to_dict()
    full = simulate(steps, outcomes, run, signal, -1.0, 1)  # never unloads: the full ReAct outcome
    out = Path(out_dir) if out_dir else run.path / "probes" / "calibrate_unload"
    out.mkdir(parents=True, exist_ok=True)
    lab.to_csv(out / "steps.csv", index=False)
    g.to_csv(out / "calibration.csv", index=False)
    res = {
        "signal": signal, "run_dir": str(run.path), "model": run.header.model.as_recorded() if run.header.model else None,
        "judge": probe.get("judge"), "removal_steps": probe.get("steps"),
        "n_steps_labelled": int(len(known)), "n_needed": int(needed.sum()), "n_done": int((~needed).sum()),
        "chosen": {"threshold": float(chosen["threshold"]), "patience": int(chosen["patience"]),
                   "J": float(chosen["J"]), "tpr": float(chosen["tpr"]), "tnr": float(chosen["tnr"]),
                   "est_accuracy": float(chosen["est_accuracy"]), "mean_image_steps": float(chosen["mean_image_steps"]),
                   "n": int(chosen["n"]), "uncovered": int(chosen["uncovered"])},
        "full_react": {"est_accuracy": full["est_accuracy"], "mean_image_steps": full["mean_image_steps"], "n": full["n"]},
        "rule": "probes/calibrate_unload/ (ours): max Youden J over influence midpoints (smallest ε on ties); "
                "M by estimated accuracy with that ε (ties: fewer image steps)",
        "mark": "scripted" if run.header.backend.kind == "scripted" else
                "random weights" if run.header.backend.embedded_tiny_model else None,
    }
    write_json(out / "calibration.json", res, indent=1, default=str)
    res["out"] = str(out)
    res["grid"] = g
    return res


def calibrate_command(a) -> int:
    """``python -m probes.calibrate_unload`` once its arguments parse."""
    try:
        pat = [int(x) for x in a.patience.split(",") if x.strip()]
        if not pat or min(pat) < 1:
            raise ValueError("--patience: comma-separated integers >= 1")
        res = calibrate(a.run_dir, signal=a.signal, patience=pat, out_dir=a.out)
    except (ToolkitError, ValueError, OSError) as e:
        log.error(f"error: {e}")
        return 2
    c = res["chosen"]
    if res["mark"]:
        print(f"NOTE: this run is from the {res['mark']} model: the calibration is a demonstration, not a result")
    print(f"{res['n_steps_labelled']} labelled steps ({res['n_needed']} where removing the images from the next step "
          f"changed the outcome, {res['n_done']} where it did not); judge: {res['judge']}")
    print(f"chosen: --unload-signal {res['signal']}  ε = {c['threshold']:.4g}  M = {c['patience']}   "
          f"(J = {c['J']:.3f}: TPR {c['tpr']:.2f}, TNR {c['tnr']:.2f})")
    print(f"estimated on the recorded trajectories: accuracy {c['est_accuracy']:.1f}% over {c['n']} "
          f"({c['uncovered']} uncovered), {c['mean_image_steps']:.2f} query-image steps kept per trajectory; "
          f"full ReAct {res['full_react']['est_accuracy']:.1f}%, {res['full_react']['mean_image_steps']:.2f}")
    if c["uncovered"]:
        log.warning(f"warning: the chosen policy unloads {c['uncovered']} trajectories at a step the removal probe did not "
                    f"replay; rerun python -m probes.removal {a.run_dir} with more --steps for a complete estimate")
    done([f"{res['out']}/calibration.json", f"{res['out']}/calibration.csv", f"{res['out']}/steps.csv"],
         f"python -m agent.run --method react --image-unload adaptive --unload-threshold "
         f"{res['out']}/calibration.json --out RUN_DIR-adaptive (with the run's benchmark and backend flags)")
    return 0


