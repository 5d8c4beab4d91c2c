"""What the viewer reads of a run beside its lines: the grades, the probes' outputs, and the per-run summary."""
from __future__ import annotations

import logging
from collections import Counter

from ..lazy import lazy_module
from ..record import EntropyStep, GroundingLabel
from ..rundir import Run, RunError, frames
from ..rundir.grades import JUDGES, grade_file
from ..rundir.lines import SOURCE_KEY
from ..rundir.probe_outputs import PROBE_OUTPUTS, NoProbeOutput, probe_dir, read_rows, read_table

pd = lazy_module("pandas")  # loads on first use: a command's --help needs none of it (agent/lazy.py)

log = logging.getLogger(__name__)
#: What the viewer shows for a grade that cannot be counted.
SEAL_BROKEN = "SEAL BROKEN"


# ---------------------------------------------------------------------------- shared data
def grades_of_run(run: Run) -> tuple[dict, str]:
    """{(sample, trial): grade} from the run's judge output (LLM judge first), and which judge. A unit whose grade
    cannot be counted (changed since written, or of another line) shows ``SEAL BROKEN``, and the file is warned of."""
    for name in JUDGES:
        p = run.path / f"judge-{name}.jsonl"
        if p.exists():
            gf = grade_file(p, run.seals())
            if gf.problem():
                log.warning(f"warning: {gf.problem()}: shown as SEAL BROKEN; python -m agent.judge {run.path} grades "
                            "those lines again")
            grades = {k: r.grade for k, r in gf.current.items()}
            return grades | dict.fromkeys(gf.broken_keys(), SEAL_BROKEN), name
    return {}, ""


def _sources(run: Run) -> dict:
    """{(sample, trial): the seal of the run's line}: a probe's row counts only when computed from it."""
    return run.seals()


def probe_steps(run: Run) -> tuple[dict, str | None]:
    """{(sample, trial, step): ΔH} from the entropy probe, and its mode (teacher-forced preferred)."""
    for mode in ("teacher-forced", "regenerate"):
        name = f"entropy-{mode}"
        rows, _ = read_rows(run.path / "probes" / name / PROBE_OUTPUTS[name][0], EntropyStep, _sources(run))
        if rows:
            return {(r.sample_id, r.trial, r.step): r.dH for r in rows}, mode
    return {}, None


def grounding_labels(run: Run) -> dict:
    """{(sample, trial): {step: {category, reasons}}} from the grounding annotator."""
    rows, _ = read_rows(run.path / "probes" / "grounding" / PROBE_OUTPUTS["grounding"][0], GroundingLabel,
                        _sources(run))
    return {(r.sample_id, r.trial): {st.step: {"category": st.category,
                                               "reasons": [x for x in (st.reason_1, st.reason_2) if x]}
                                     for st in r.steps} for r in rows}


def removal_outcomes(run: Run) -> dict:
    """{(sample, trial): [{k, replay_correct, replayed, status, error}]} from the step-k removal replays, with the
    original's grade under ``original``."""
    try:
        table = read_table(probe_dir(run.path, ("removal",), "probes.removal"), ("outcomes",))
    except NoProbeOutput:
        return {}
    out: dict = {}
    sources = _sources(run)
    for r in table.to_dict("records"):
        key = (r["sample_id"], int(r["trial"]))
        if SOURCE_KEY in r and r[SOURCE_KEY] != sources.get(key):
            continue  # computed from a line the run no longer holds
        rc = r.get("replay_correct")
        out.setdefault(key, []).append({
            "k": int(r["k"]), "correct": None if pd.isna(rc) else bool(rc), "original": bool(r.get("original_correct")),
            "replayed": bool(r.get("replayed")), "status": r.get("replay_status") or "",
            "error": "" if pd.isna(r.get("error")) else r.get("error")})
    for v in out.values():
        v.sort(key=lambda x: x["k"])
    return out


#: What the HTML viewer keeps of each line's summary (``load_run(path, fields=VIEW_FIELDS)``): its row in the list,
#: a few hundred bytes a trajectory, so the writer's memory does not grow with the run's calls (the whole line is
#: read again, one at a time, for its page; the calls' counts come from :func:`agent.rundir.frames.steps`).
VIEW_FIELDS = ("status", "benchmark", "paper_category", "n_calls", "n_tool_calls", "answer", "gold")


def run_summary(run: Run) -> dict:
    """The landing pane's numbers: statuses, accuracy per judge, calls and tokens, and which probes ran."""

    idx = run.index
    statuses = Counter(ln.status for ln in idx)

    judges = {}
    sources = run.seals()
    for name in ("llm", "exact"):
        p = run.path / f"judge-{name}.jsonl"
        current = grade_file(p, sources).current  # only intact grades of the lines the run holds count
        grades = {k: r.grade for k, r in current.items()}
        label = next((r.judge for r in current.values() if r.judge), name)
        if not grades:
            continue
        n = len(grades)
        judges[label] = {"graded": n, "correct": sum(g == "CORRECT" for g in grades.values()),
                         "accuracy": round(100.0 * sum(g == "CORRECT" for g in grades.values()) / n, 1) if n else None}
    calls = frames.steps(run.path)  # one row per call, read from the index as it goes
    n_calls = len(calls)
    prompt, completion = (int(calls[c].fillna(0).sum()) for c in ("prompt_tokens", "completion_tokens"))
    probes = {}
    pd_ = run.path / "probes"
    for d in sorted(pd_.iterdir()) if pd_.is_dir() else []:
        if not d.is_dir():
            continue
        if d.name in PROBE_OUTPUTS:
            rows, _ = read_rows(d / PROBE_OUTPUTS[d.name][0], PROBE_OUTPUTS[d.name][1], sources)
            what = "trajectories annotated" if d.name == "grounding" else "steps probed"
            probes[d.name] = f"{len(rows)} {what}"
        elif d.name == "removal":
            try:
                o = read_table(d, ("outcomes",))
                ran = int(o["replayed"].astype(bool).sum()) if "replayed" in o else len(o)
                probes[d.name] = (f"{ran} replays" + (f" ({len(o) - ran} of the {len(o)} (trajectory, k) pairs ended "
                                                      "before step k: nothing to replay)" if ran < len(o) else ""))
            except NoProbeOutput:
                probes[d.name] = "present"
            except RunError as e:  # not as sealed: said, never counted
                probes[d.name] = f"not shown: {e}"
        else:
            probes[d.name] = "present"
    if (run.header.image_unload or {}).get("policy"):
        probes["adaptive image unloading"] = "online (unload_probe events in each trajectory)"
    return {"trajectories": len(idx), "statuses": dict(statuses), "judges": judges, "llm_calls": n_calls,
            "mean_calls": round(n_calls / len(idx), 2) if idx else None,
            "prompt_tokens": prompt, "completion_tokens": completion,
            "tool_calls": sum(ln.n_tool_calls for ln in idx), "probes": probes,
            "method": run.header.label, "trials": run.header.trials}


def sample_table(run: Run):
    """One row per (sample, trial): status, calls, answer, gold, grade."""

    grades, judge = grades_of_run(run)
    rows = [{"sample_id": ln.sample_id, "trial": ln.trial, "benchmark": ln.benchmark, "status": ln.status,
             "calls": ln.n_calls, "answer": ln.answer, "gold": ln.gold, "grade": grades.get(ln.key, "")}
            for ln in run.index]
    df = pd.DataFrame(rows)
    df.attrs["judge"] = judge
    return df.sort_values(["sample_id", "trial"]).reset_index(drop=True) if len(df) else df


def short(text: str | None, n: int) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= n else text[: n - 1] + "…"
