"""Stored grades: the judges' ``judge-<name>.jsonl`` files of a run, read back.

Records only (no model call): what ``agent.judge`` wrote, read as bytes line by line (a torn line is skipped),
and the latest grade per (sample, trial). Accuracy over them, as Table 1 lays it out: accuracy.py.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..paths import read_regular
from ..trajectory import responses_fingerprint
from .common import RunError

__all__ = ["JUDGES", "read_grades", "latest_grades", "grades_of", "identical_trials"]

JUDGES = ("llm", "exact")


def identical_trials(lines) -> str | None:
    """Why a std over these trials would be meaningless, or None: every sample run in several trials has the
    very same responses in each (one trial repeated: a deterministic server without per-trial seeds, or a
    scripted backend). Table 1's "± std over three independent trials" needs them to differ somewhere."""
    by_sample: dict = {}
    for ln in lines:  # a line's summary carries its digest (runs recorded before it: computed from the events)
        by_sample.setdefault(ln["sample_id"], {})[ln["trial"]] = ln.get("responses_sha") or responses_fingerprint(ln)
    multi = {s: d for s, d in by_sample.items() if len(d) > 1}
    if not multi or any(len(set(d.values())) > 1 for d in multi.values()):
        return None
    trials = sorted({t for d in multi.values() for t in d})
    return (f"the trials {trials} are identical: each of the {len(multi)} samples run in several trials has the same "
            "responses in every trial (a deterministic server without per-trial seeds, or a scripted backend), so "
            "they are one trial repeated and a std over them is refused")


def read_grades(path) -> list[dict]:
    """The records of a ``judge-*.jsonl``, read as bytes line by line: a torn line (a kill mid-write, a cut
    multi-byte character) is skipped, never a crash."""
    out: list[dict] = []
    try:
        data = read_regular(path, RunError)
    except FileNotFoundError:
        return out
    for raw in data.split(b"\n"):
        if not raw.strip():
            continue
        try:
            r = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            continue
        if isinstance(r, dict):
            out.append(r)
    return out


def latest_grades(path: Path) -> dict:
    recs = {}
    for r in read_grades(path):  # torn lines (a kill mid-write, a cut multi-byte character) skipped
        if "sample_id" in r and "trial" in r:
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
            recs = latest_grades(p)
            labels = sorted({r.get("judge", name) for r in recs.values()})
            if len(labels) > 1:
                raise RunError(f"{p} holds grades of {len(labels)} judges ({'; '.join(labels)}); regrade with one "
                               f"judge (python -m agent.judge {run_dir} --regrade)")
            label = labels[0] if labels else name
            served = sorted({r["judge_served_model"] for r in recs.values() if r.get("judge_served_model")})
            if len(served) > 1:  # the judge's replies named different models: rerouted mid-run
                raise RunError(f"{p}: the judge's replies name {len(served)} models ({', '.join(served)}): the judge "
                               f"was rerouted while grading. Regrade with one (python -m agent.judge {run_dir} --regrade)")
            if served:
                label = f"{label} [served: {served[0]}]"
            return list(recs.values()), label
    want = f"--judge {judge} " if judge else ""
    raise RunError(f"{run_dir}: no {judge + ' ' if judge else ''}judge output; run python -m agent.judge {run_dir} "
                   f"{want}first")


