"""Every figure and table the runs and probes allow, in one command.

    python -m analysis.report --react runs/react-27b --runs runs/direct runs/react-27b runs/mmcf-27b \\
        --removal-runs runs/react-27b runs/react-rm1 runs/react-rm3 [--out figures/out]

- ``--react RUN``: a ReAct run whose probes were run (``probes.grounding``, ``probes.entropy``,
  ``probes.removal``): Figure 1 (tool calls by type per step), Figure 2 (a)(b)(c) as one figure and as
  separate panels.
- ``--runs RUN ...``: judged runs, one per method/backbone: Table 1 (accuracy), Table 4 (tokens,
  working context, tool calls), Table 5 (MMSearch-Plus by number of images), Figure 4.
- ``--removal-runs RUN ...``: judged ReAct and ReAct-Removal@k runs: Table 3.

What cannot be made (a probe not run, a run not judged) is listed, not faked. Output: ``--out``
(default ``figures/out``), PNG + PDF figures and Markdown + CSV tables.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from agent.rundir import RunError, load_run

from . import figures, tables

__all__ = ["make_report", "main"]


def _read_csv(p: Path):
    import pandas as pd

    return pd.read_csv(p) if p.exists() else None


def make_report(*, react: str | None = None, runs=(), removal_runs=(), out="figures/out") -> dict:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    made, missing = [], []
    if react:
        run = load_run(react)
        calls = run.calls()
        if len(calls):
            figures.fig1_tool_calls(calls, out / "fig1_tool_calls")
            made.append("fig1_tool_calls")
        probes = Path(react) / "probes"
        g = probes / "grounding" / "steps.csv"
        ent = next((p for p in (probes / "entropy-regenerate" / "summary.csv", probes / "entropy-teacher-forced" / "summary.csv")
                    if p.exists()), None)
        rem = probes / "removal" / "summary.csv"
        gs, es, rs = _read_csv(g), _read_csv(ent) if ent else None, _read_csv(rem)
        for name, data, fn in (("fig2a_grounding", gs, figures.fig2a_grounding), ("fig2b_entropy", es, figures.fig2b_entropy),
                               ("fig2c_removal", rs, figures.fig2c_removal)):
            if data is None:
                ran = name == "fig2a_grounding" and (probes / "grounding" / "summary.json").exists()
                missing.append(f"{name}: the grounding probe produced no valid labels (see {probes / 'grounding' / 'summary.json'})"
                               if ran else f"{name}: run the probe on {react} first")
            else:
                fn(data, out / name)
                made.append(name)
        figures.fig2_combined(gs, es, rs, out / "fig2")
        made.append("fig2")
    judged = []
    for rd in runs:
        try:
            tables.grades_of(rd)
            judged.append(rd)
        except RunError as e:
            missing.append(str(e))
    if runs:
        tables.write_table(tables.table4(runs), out / "table4_cost")
        made.append("table4_cost")
    if judged:
        tables.write_table(tables.table1(judged), out / "table1_accuracy")
        made.append("table1_accuracy")
        t5 = tables.table5(judged)
        if len(t5):
            tables.write_table(t5, out / "table5_mmsearch_plus_images")
            made.append("table5_mmsearch_plus_images")
        import pandas as pd

        calls, samples = [], []
        for rd in judged:
            run = load_run(rd)
            label = tables._label(run)
            recs, _ = tables.grades_of(rd)
            ok = {(r["sample_id"], r["trial"]): r["grade"] == "CORRECT" for r in recs}
            c = run.calls()
            c["method"] = label
            s = run.samples()
            s["method"] = label
            s["correct"] = [ok.get((a, b), False) for a, b in zip(s.sample_id, s.trial)]
            calls.append(c)
            samples.append(s)
        figures.fig4_context(pd.concat(calls), pd.concat(samples), out / "fig4_context")
        made.append("fig4_context")
    if removal_runs:
        try:
            tables.write_table(tables.table1(removal_runs), out / "table3_removal")
            made.append("table3_removal")
        except RunError as e:
            missing.append(str(e))
    (out / "report.json").write_text(json.dumps({"made": made, "missing": missing}, indent=2))
    return {"made": made, "missing": missing, "out": out}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.report", description=__doc__.split("\n\n")[0])
    ap.add_argument("--react", help="a probed ReAct run (Figures 1 and 2)")
    ap.add_argument("--runs", nargs="*", default=[], help="judged runs (Tables 1, 4, 5; Figure 4)")
    ap.add_argument("--removal-runs", nargs="*", default=[], help="judged ReAct / ReAct-Removal@k runs (Table 3)")
    ap.add_argument("--out", default="figures/out")
    a = ap.parse_args(argv)
    if not (a.react or a.runs or a.removal_runs):
        ap.error("give --react and/or --runs and/or --removal-runs")
    try:
        r = make_report(react=a.react, runs=a.runs, removal_runs=a.removal_runs, out=a.out)
    except (RunError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote to {r['out']}: {', '.join(r['made']) or 'nothing'}")
    for m in r["missing"]:
        print(f"not made: {m}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
