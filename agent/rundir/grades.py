"""Stored grades: the judges' ``judge-<name>.jsonl`` files of a run, read back.

Records only (no model call): what ``agent.judge`` wrote, read as bytes line by line. Each grade is sealed with its
own checksum and names the seal of the result line it grades (``source_sha256``): a grade edited since it was
written, torn, or of a line the run does not hold is never counted (:class:`BrokenGrades` for every table).
Accuracy over them, as Table 1 lays it out: accuracy.py.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ..record import Grade, LineSummary, SchemaError, validate
from .common import RunError
from .lines import SEAL_KEY, SOURCE_KEY, SealedRows, read_sealed
from .writer import RunDir

__all__ = ["JUDGES", "BrokenGrades", "MixedJudges", "GradeFile", "grade_file", "sources_of", "read_grades", "latest_grades",
           "grades_of", "identical_trials"]

JUDGES = ("llm", "exact")


def identical_trials(lines: "Iterable[LineSummary]") -> str | None:
    """Why a std over these trials would be meaningless, or None: every sample run in several trials has the
    very same responses in each (one trial repeated: a deterministic server without per-trial seeds, or a
    scripted backend). Table 1's "± std over three independent trials" needs them to differ somewhere."""
    by_sample: dict = {}
    for ln in lines:  # a line's summary carries the digest of its responses
        by_sample.setdefault(ln.sample_id, {})[ln.trial] = ln.responses_sha
    multi = {s: d for s, d in by_sample.items() if len(d) > 1}
    if not multi or any(len(set(d.values())) > 1 for d in multi.values()):
        return None
    trials = sorted({t for d in multi.values() for t in d})
    return (f"the trials {trials} are identical: each of the {len(multi)} samples run in several trials has the same "
            "responses in every trial (a deterministic server without per-trial seeds, or a scripted backend), so "
            "they are one trial repeated and a std over them is refused")


class BrokenGrades(RunError):
    """A judge file holding grades that cannot be trusted as they are (edited since written, torn, or of a result
    line the run does not hold): never counted in a table; ``python -m agent.judge RUN`` sets them aside and
    grades those lines again."""


class MixedJudges(RunError):
    """Runs graded by different judges asked into one table: refused (one table, one judge), never a missing panel."""


def read_grades(path) -> list[Grade]:
    """The intact grades of a ``judge-*.jsonl`` in file order (each one whose seal matches its bytes and that is a
    valid grade record): a changed, torn or invalid line is left out here; :func:`grade_file` says which."""
    return [g for r in read_sealed(path).rows if (g := _grade(r, path)) is not None]


def _grade(row: dict, path) -> Grade | None:
    """A sealed grade as its model; None for one its model refuses (another version's, or edited and sealed again)."""
    try:
        return validate("grade", {k: v for k, v in row.items() if k != "_lineno"}, f"{path} line {row['_lineno']}")
    except SchemaError:
        return None


@dataclass
class GradeFile:
    """A judge file read against the run it grades: ``current`` {(sample, trial): the latest intact grade of the line
    the run holds now}, ``sealed`` (the file's lines as :func:`read_sealed` read them), ``foreign`` (line numbers of
    intact grades whose source is not the run's line, and that no grade of the run's line follows: a grade copied
    from another line, of a unit the run does not hold, or of a line since replaced and not graded again) and
    ``invalid`` (line numbers of sealed lines that are no valid grade record)."""

    sealed: SealedRows
    current: dict[tuple[str, int], Grade] = field(default_factory=dict)
    foreign: list = field(default_factory=list)
    invalid: list = field(default_factory=list)

    def unusable(self) -> list:
        """The line numbers beside the changed and torn ones that are never counted: what is set aside."""
        return sorted(self.foreign + self.invalid)

    def broken_keys(self) -> set:
        """The (sample, trial) of every unit whose grade cannot be counted: changed, invalid, or of another line."""
        bad = {(r["sample_id"], r["trial"]) for r in self.sealed.rows if r["_lineno"] in self.unusable()}
        return (set(self.sealed.changed_keys) | bad) - set(self.current)

    def problem(self) -> str | None:
        """One sentence naming the file and every line that cannot be counted, or None."""
        p = self.sealed.problem()
        for lines, what in ((self.foreign, "grade(s) result line(s) the run does not hold (the grade's source_sha256 "
                                           "is not the line's seal)"),
                            (self.invalid, "are no valid grade record (another version's, or edited and sealed "
                                           "again)")):
            if lines:
                said = f"line(s) {', '.join(map(str, lines[:8]))} {what}"
                p = f"{p}; {said}" if p else f"{self.sealed.path}: {said}"
        return p


def grade_file(path, sources: dict) -> GradeFile:
    """The grades of ``path`` against ``sources`` {(sample, trial): the seal of the run's line}."""
    out = GradeFile(read_sealed(path))
    last: dict = {}  # unit -> the position of its last grade of the run's line
    valid = []
    for r in out.sealed.rows:
        g = _grade(r, path)
        if g is None:
            out.invalid.append(r["_lineno"])
            continue
        valid.append(r)
        k = (r["sample_id"], r["trial"])
        if r.get(SOURCE_KEY) is not None and r[SOURCE_KEY] == sources.get(k):
            out.current[k], last[k] = g, len(valid) - 1
    # a grade of another line after the unit's last grade of its own (a replaced line's grades before it are history)
    out.foreign = [r["_lineno"] for i, r in enumerate(valid)
                   if i > last.get((r["sample_id"], r["trial"]), -1) and r.get(SOURCE_KEY) != sources.get(
                       (r["sample_id"], r["trial"]))]
    return out


def sources_of(run_dir) -> dict:
    """{(sample, trial): the seal of the run's latest line}: what grades and probe rows must name."""
    return {k: ln[SEAL_KEY] for k, ln in RunDir(run_dir).latest(lambda s: {}).items()}


def latest_grades(path: Path, sources: dict | None = None) -> dict[tuple[str, int], Grade]:
    """{(sample, trial): latest intact grade}; with ``sources``, only grades of the run's current lines."""
    if sources is not None:
        return grade_file(path, sources).current
    return {(r.sample_id, r.trial): r for r in read_grades(path)}


def grades_of(run_dir, judge: str | None = None) -> tuple[list[Grade], str]:
    """The latest grade per (sample, trial) of a run, and the judge's label.

    ``judge=None`` takes the LLM judge's output when there is one, else exact match. A file holding the
    grades of more than one judge is refused (a table must never mix judges), and so is one holding grades that
    cannot be counted (:class:`BrokenGrades`: changed, torn, or of a line the run does not hold).
    """
    run_dir = Path(run_dir)
    names = [judge] if judge else list(JUDGES)
    for name in names:
        p = run_dir / f"judge-{name}.jsonl"
        if p.exists():
            gf = grade_file(p, sources_of(run_dir))
            problem = gf.problem()
            if problem:
                raise BrokenGrades(f"{problem}: these grades are not counted in any table. python -m agent.judge "
                                   f"{run_dir} sets them aside and grades those lines again")
            recs = gf.current
            labels = sorted({r.judge for r in recs.values()})
            if len(labels) > 1:
                raise RunError(f"{p} holds grades of {len(labels)} judges ({'; '.join(labels)}); regrade with one "
                               f"judge (python -m agent.judge {run_dir} --regrade)")
            label = labels[0] if labels else name
            served = sorted({r.judge_served_model for r in recs.values() if r.judge_served_model})
            if len(served) > 1:  # the judge's replies named different models: rerouted mid-run
                raise RunError(f"{p}: the judge's replies name {len(served)} models ({', '.join(served)}): the judge "
                               f"was rerouted while grading. Regrade with one (python -m agent.judge {run_dir} --regrade)")
            if served:
                label = f"{label} [served: {served[0]}]"
            return list(recs.values()), label
    want = f"--judge {judge} " if judge else ""
    raise RunError(f"{run_dir}: no {judge + ' ' if judge else ''}judge output; run python -m agent.judge {run_dir} "
                   f"{want}first")


