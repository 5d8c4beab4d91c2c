"""The work of ``python -m analysis.report`` once its arguments parse: analysis/report/cli.py holds the flags, the
package's docstring says what it does and writes."""
from __future__ import annotations

import json
import logging
import re
from pathlib import Path

from agent.cli import done
from agent.errors import ToolkitError
from agent.lazy import lazy_module
from agent.rundir import RunError, frames, load_run
from agent.rundir.grades import BrokenGrades, MixedJudges
from analysis.estimators.stats import removal_summary, summarise_by
from analysis.pooling import refuse_mixed_servers
from analysis.unload import unload_points, unload_steps
from probes.entropy import bounds_by_step

from .. import figures, robustness, tables
from ..tables import method_label

pd = lazy_module("pandas")  # loads on first use: a command's --help needs none of it (agent/lazy.py)

log = logging.getLogger(__name__)

__all__ = ["make_report", "report_command"]


def _probe(reader, rd, **kw):
    """A probe's output as :mod:`agent.rundir.frames` reads it; None when that probe has not run on ``rd``."""
    try:
        return reader(rd, **kw)
    except frames.NoProbeOutput:
        return None


def _entropy_steps(rd):
    e = _probe(frames.entropy, rd)
    return (e, e.attrs["mode"]) if e is not None else (None, None)


def _with_bounds(g):
    """ΔH per step, with the ΔH interval where the probe recorded it (probes/entropy)."""
    out = summarise_by(g, "step", "dH")
    if "dH_low" in g and g["dH_low"].notna().any():
        out = out.merge(bounds_by_step(g), on="step", how="left")
    return out


def _entropy_summary(entropy: list, modes: set, react_runs: list):
    """Figure 2(b)'s data: one curve per run, and the pooled one when there are several."""
    if len(modes) > 1:
        raise RunError(f"the entropy probes of {react_runs} ran in different modes ({sorted(modes)}): one mode per figure")
    allsteps = pd.concat(entropy, ignore_index=True)
    valid = allsteps[allsteps["dH"].notna()]
    parts = [_with_bounds(g).assign(series=name) for name, g in valid.groupby("series", sort=False)]
    if len(entropy) > 1:
        parts.append(_with_bounds(valid).assign(series="pooled"))
    es = pd.concat(parts, ignore_index=True)
    es.attrs["mode"] = next(iter(modes))
    return es


def _kl_summ(g):
    return summarise_by(g, "step", "kl_with_without").rename(
        columns={"mean": "kl_with_without", "ci_low": "kl_ci_low", "ci_high": "kl_ci_high", "n": "kl_n"})


def _kl_summary(tf: list):
    """The images' KL influence per step (teacher-forced probe): per run, and pooled over several."""
    allkl = pd.concat(tf, ignore_index=True)
    allkl = allkl[allkl["kl_with_without"].notna()]
    if not len(allkl):
        return None
    kparts = [_kl_summ(g).assign(series=name) for name, g in allkl.groupby("series", sort=False)]
    if len(tf) > 1:
        kparts.append(_kl_summ(allkl).assign(series="pooled"))
    return pd.concat(kparts, ignore_index=True)


#: What the report keeps of each line's summary where it needs only the run's headers and model (ours: a
#: paper-scale run's whole summaries are large to hold, docs/performance.md; the readers below read what they need).
_MODEL_ONLY = ("model",)


def _pooled_figure2(react_runs: list[str], out: Path, made: list, missing: list):
    """Figure 2 panels pooled over the given ReAct runs (and, for (b), one curve per run)."""
    by_model: dict = {}
    for rd in react_runs:  # a model's runs pool only if their servers computed alike
        run = load_run(rd, fields=_MODEL_ONLY)
        by_model.setdefault(tables.model_label(run) or Path(rd).name, []).append(run)
    for label, runs in by_model.items():
        refuse_mixed_servers(f"Figure 2, {label}", runs)
    grounding, entropy, outcomes, modes, headers, labels, tf = [], [], [], set(), [], [], []
    for rd in react_runs:
        probes = Path(rd) / "probes"
        run = load_run(rd, fields=_MODEL_ONLY)
        headers.append(run.header)
        label = tables.model_label(run) or Path(rd).name
        labels.append(label)
        g = _probe(frames.grounding, rd)
        if g is not None and len(g):
            grounding.append(g)
        elif (probes / "grounding" / "summary.json").exists():
            missing.append(f"fig2a_grounding: {rd}: the grounding probe produced no valid labels "
                           f"(see {probes / 'grounding' / 'summary.json'})")
        else:
            fake = " --judge scripted" if run.header.backend.kind == "scripted" else ""
            missing.append(f"fig2a_grounding: run python -m probes.grounding {rd}{fake} first")
        e, mode = _entropy_steps(rd)
        # the KL influence needs the teacher-forced probe (ours: its own panel, even when (b) is regenerated)
        t = _probe(frames.entropy, rd, mode="teacher-forced")
        if t is not None and "kl_with_without" in t:
            tf.append(t.assign(series=label))
        if e is not None:
            e = e.assign(series=label)
            entropy.append(e)
            modes.add(mode)
        else:
            missing.append(f"fig2b_entropy: run python -m probes.entropy {rd} first")
        o = _probe(frames.removal, rd)
        if o is not None and len(o):
            outcomes.append(o)
        elif run.header.remove_images_from_step is not None:  # the replays need the images kept
            missing.append(f"fig2c_removal: {rd} is a Removal@k run; step-k replays start from a plain ReAct run")
        else:
            missing.append(f"fig2c_removal: run python -m probes.removal {rd} first")
    gs = pd.concat(grounding, ignore_index=True) if grounding else None
    es = _entropy_summary(entropy, modes, react_runs) if entropy else None
    ks = _kl_summary(tf) if tf else None
    rs = removal_summary(pd.concat(outcomes, ignore_index=True)) if outcomes else None
    mark = figures.provenance_mark(headers)
    who = ", ".join(dict.fromkeys(labels))
    pool = f"; pooled over {len(react_runs)} runs" if len(react_runs) > 1 else ""
    mode = es.attrs.get("mode") if es is not None else ""
    panels = [("fig2a_grounding", gs, figures.fig2a_grounding, f"Figure 2(a): grounding of each step ({who}{pool})"),
              ("fig2b_entropy", es, figures.fig2b_entropy, f"Figure 2(b): ΔH per step ({who}, {mode}{pool})"),
              ("fig2c_removal", rs, figures.fig2c_removal, f"Figure 2(c): step-k image removal ({who}{pool})")]
    if ks is not None:
        panels.append(("fig2b_kl_influence", ks, figures.fig2b_kl, f"Image influence per step ({who}, teacher-forced{pool})"))
    drawn = 0
    for name, data, fn, title in panels:
        if data is not None and len(data):
            figures.draw(fn, (data,), out / name, title=title, mark=mark)  # not again from the same inputs
            figures.write_csv(data, (out / name).with_suffix(".csv"), index=False)  # the plotted numbers, beside the figure
            made.append(name)
            drawn += 1
    if not drawn:  # a figure with no data is not made (the reasons are listed above)
        missing.append("fig2: no probe output for any panel")
        return
    figures.draw(figures.fig2_combined, (gs, es, rs), out / "fig2", mark=mark, subtitle=f"Figure 2 ({who}{pool})",
                 kl_summary=ks)
    made.append("fig2")
    if entropy:
        _robustness(pd.concat(entropy, ignore_index=True), out, made, missing, mark,
                    f"ΔH per step under each aggregation ({who}, {mode}{pool})")


def _robustness(steps, out: Path, made: list, missing: list, mark, title: str) -> None:
    """Beyond the paper (issue 85): Figure 2(b)'s ΔH under every aggregation, with a verdict per step; the numbers
    in a CSV, the verdicts in a Markdown table, one figure panel."""
    try:
        rob = robustness.robustness(steps)
    except RunError as e:
        missing.append(f"robustness: {e}")
        return
    ver = robustness.verdicts(rob)
    figures.write_csv(rob, out / "robustness.csv", index=False)
    lines = ["# Is ΔH robust to how it is aggregated? (beyond the paper)", "",
             "Per step, all categories pooled: does the sign of ΔH (and its significance: bootstrap CI excludes 0, "
             f"Wilcoxon p < {robustness.SIGNIFICANCE}) under the paper's mean over the think tokens hold under every "
             "aggregation? Numbers per aggregation and category: robustness.csv.", "",
             "| step | n | holds | verdict |", "|---|---|---|---|"]
    lines += [f"| {v.step} | {v.n} | {'yes' if v.holds else 'NO'} | {v.verdict} |" for v in ver.itertuples()]
    lines += ["", "Aggregations: " + "; ".join(f"`{k}`: {v}" for k, v in robustness.AGGREGATION_LABELS.items())]
    figures.write_text(out / "robustness.md", "\n".join(lines) + "\n")
    figures.draw(figures.fig2b_robustness, (rob,), out / "fig2b_robustness", labels=robustness.AGGREGATION_LABELS,
                 title=title, mark=mark)
    made += ["robustness", "fig2b_robustness"]


def _predictors(react: list, out: Path, made: list, missing: list, judge: str | None) -> None:
    """Beyond the paper (issue 85): which signal predicts a correct answer (AUROC, bootstrap CI), per model and
    benchmark of the probed ReAct runs; a run that is not judged is listed, not faked."""
    judged = [rd for rd in react if any(Path(rd).glob("judge-*.jsonl"))]
    for rd in sorted(set(react) - set(judged)):
        missing.append(f"predictors: {rd} is not judged (python -m agent.judge {rd})")
    if not judged:
        return
    p = robustness.predictors(judged, judge, missing)
    if p.empty:  # no run had the judge asked for: each is in missing
        return
    figures.write_csv(p, out / "predictors.csv", index=False)
    lines = ["# What predicts a correct answer? (beyond the paper)", "",
             "AUROC for the judge's CORRECT over trajectories, 95% bootstrap CI (0.5: no signal). Agreement: the "
             "share of the sample's other trials with the same answer; think entropy: its negative (lower predicts "
             "correct); ΔH: the trajectory's mean over its probed steps, as measured.", "",
             "| model | benchmark | predictor | n | AUROC | 95% CI | note |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r.model} | {r.benchmark} | {r.predictor} | {r.n} | "
              + ("" if r.auroc != r.auroc else f"{r.auroc:.3f}") + " | "
              + ("" if r.ci_low != r.ci_low else f"[{r.ci_low:.3f}, {r.ci_high:.3f}]") + f" | {r.note} |"
              for r in p.itertuples()]
    figures.write_text(out / "predictors.md", "\n".join(lines) + "\n")
    made.append("predictors")


def _unload_figure(react, removal_runs, unload_runs, out: Path, made: list, missing: list, judge):
    """The adaptive-unloading figure (ours): needs the adaptive runs and at least one reference policy."""

    plain = [rd for rd in react if not load_run(rd, fields=_MODEL_ONLY).header.variant]
    refs = list(dict.fromkeys([*removal_runs, *plain]))  # ReAct (images kept) and Removal@k runs
    pts = unload_points(refs, unload_runs, react_runs=plain, judge=judge)
    missing += pts.attrs.get("missing", [])
    st = unload_steps(unload_runs)
    heads = [load_run(rd, fields=_MODEL_ONLY).header for rd in [*refs, *unload_runs, *plain]]
    mark = figures.provenance_mark(heads)
    figures.fig_unload(pts, st, out / "fig_unload", mark=mark,
                        subtitle=f"Adaptive image unloading ({pts.attrs.get('model') or '?'}; judge: {pts.attrs.get('judge')})")
    figures.write_csv(pts, out / "fig_release_points.csv", index=False)
    figures.write_csv(st, out / "fig_release_steps.csv", index=False)
    made.append("fig_unload")


def _figure4(judged, out: Path, made: list, missing: list) -> None:
    """Figure 4 over the judged agentic runs: pooled over the backbones when every method covers the same ones
    (the paper's Figure 4 pools its five), else one figure per backbone (never a pool of different model
    mixes: ours). The binned numbers go in the CSV beside each figure."""

    samples = []
    for run, g in judged:
        if run.header.method == "direct":  # Figure 4 compares the agentic methods (§4.4)
            continue
        ok = dict(zip(zip(g["sample_id"], g["trial"]), g["correct"]))
        s = tables.trajectory_frame(run)
        s["method"] = method_label(run)
        s["model"] = tables.model_label(run) or "?"
        s["correct"] = [bool(ok.get((a, b), False)) for a, b in zip(s.sample_id, s.trial)]
        s["_mark"] = figures.provenance_mark([run.header])
        samples.append(s)
    if not samples:
        missing.append("fig4_context: no judged agentic run (direct inference is not in Figure 4)")
        return
    df = pd.concat(samples, ignore_index=True)
    covers = df.groupby("method")["model"].agg(lambda m: frozenset(m))
    models = list(dict.fromkeys(df["model"]))

    def draw(d, stem, title):
        marks = [m for m in dict.fromkeys(d["_mark"]) if m]
        figures.draw(figures.fig4_context, (d,), out / stem, mark=" | ".join(marks) or None, title=title)
        made.append(stem)

    if len(models) == 1 or covers.nunique() == 1:
        pool = f"pooled over {len(models)} backbones: {', '.join(models)}" if len(models) > 1 else models[0]
        draw(df, "fig4_context", f"Figure 4 ({pool})")
        return
    detail = "; ".join(f"{m}: {', '.join(sorted(v))}" for m, v in covers.items())
    missing.append(f"fig4_context: not pooled over backbones, the methods cover different models ({detail}); "
                   "drawn per model instead")
    for i, model in enumerate(models):
        draw(df[df["model"] == model], f"fig4_context-{_slug(model) or i}", f"Figure 4 ({model})")


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", s).strip("_")[:60]


def _table(build, missing: list):
    """A table of the report, or None with why it is not made added to ``missing``; a grade that cannot be counted,
    or two judges in one table, stops the report (raised)."""
    try:
        return build()
    except (BrokenGrades, MixedJudges):
        raise
    except RunError as e:
        missing.append(str(e))
        return None


def _run_tables(runs: list, out: Path, made: list, missing: list, judge: str | None) -> None:
    """Tables 1, 4 (with the cost ledger), 5 and Figure 4 from the judged ``--runs``; HLE-VL runs among them make
    Table 13 of their own (D.1) and enter no other table."""
    apart = [rd for rd in runs if load_run(rd, fields=_MODEL_ONLY).header.benchmark in tables.SUPPLEMENTARY]
    runs = [rd for rd in runs if rd not in apart]
    if apart:  # HLE-VL: Table 13 of its own (D.1), never in Tables 1, 4, 5
        t13 = _table(lambda: tables.table13(apart, judge), missing)
        if t13 is not None:
            tables.write_table(t13, out / "table13_hle_vl")
            made.append("table13_hle_vl")
    if runs:
        tables.write_table(tables.table4(runs), out / "table4_cost")
        made.append("table4_cost")
        led = tables.ledger_table(runs)  # beside Table 4: what the runs cost (agent/rundir/ledger.py)
        tables.write_table(led, out / "table4_ledger")
        made.append("table4_ledger")
        print("cost ledger (table4_ledger.md):\n" + led.to_string(index=False))
        t1 = _table(lambda: tables.table1(runs, judge), missing)
        if t1 is not None:
            missing += t1.attrs.get("missing", [])
            tables.write_table(t1, out / "table1_accuracy")
            made.append("table1_accuracy")
            t5 = tables.table5(runs, judge=judge)
            if len(t5):
                tables.write_table(t5, out / "table5_mmsearch_plus_images")
                made.append("table5_mmsearch_plus_images")
            judged, _, _ = tables.judged_runs(runs, judge)
            _figure4(judged, out, made, missing)


def make_report(*, react=(), runs=(), removal_runs=(), out="figures/out", judge: str | None = None,
                unload_runs=()) -> dict:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    made, missing = [], []
    react = [react] if isinstance(react, (str, Path)) else list(react)
    rr = [load_run(rd, fields=_MODEL_ONLY) for rd in react]
    for rd, r in zip(react, rr):  # before any work: Figures 1 and 2 are the ReAct probes' (paper §3.2)
        if r.header.method != "react":
            raise RunError(f"--react {rd}: this is a {method_label(r)} run; Figures 1 and 2 read probed ReAct runs "
                           f"(paper §3.2). Pass it with --runs (Tables 1, 4, 5; Figure 4) instead")
    if react:
        calls = pd.concat([frames.steps(rd) for rd in react], ignore_index=True).rename(columns={"call": "index"})
        if len(calls):
            who = ", ".join(dict.fromkeys(tables.model_label(r) for r in rr))
            figures.draw(figures.fig1_tool_calls, (calls,), out / "fig1_tool_calls",
                         mark=figures.provenance_mark([r.header for r in rr]),
                         title=f"Figure 1: tool calls by type per step ({who}; numbers: calls at that step)")
            made.append("fig1_tool_calls")
        _pooled_figure2(react, out, made, missing)
        _predictors(react, out, made, missing, judge)
    _run_tables(list(runs), out, made, missing, judge)
    if removal_runs:
        t3 = _table(lambda: tables.table1(removal_runs, judge), missing)
        if t3 is not None:
            missing += t3.attrs.get("missing", [])
            tables.write_table(t3, out / "table3_removal")
            made.append("table3_removal")
    if unload_runs:
        _unload_figure(react, removal_runs, list(unload_runs), out, made, missing, judge)
    figures.write_text(out / "report.json", json.dumps({"made": made, "missing": missing}, indent=2))
    return {"made": made, "missing": missing, "out": out}


def report_command(a) -> int:
    """``python -m analysis.report`` once its arguments parse."""
    try:
        r = make_report(react=a.react, runs=a.runs, removal_runs=a.removal_runs, out=a.out, judge=a.judge,
                        unload_runs=a.unload_runs)
    except (ToolkitError, OSError, ValueError) as e:
        log.error(f"error: {e}")
        return 2
    print(f"wrote to {r['out']}: {', '.join(r['made']) or 'nothing'}")
    for m in r["missing"]:
        log.info(f"not made: {m}")
    done([f"{r['out']}/{m}.*" for m in r["made"]] + [f"{r['out']}/report.json"],
         "open the PNGs; every figure's numbers are in the CSV beside it")
    return 0


