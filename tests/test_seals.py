"""Grades sealed to the lines they grade (issue 68): a grade edited after it was written (``sed``, then ``cp -r``), or
a grade of another line, is reported by check, set aside and graded again by the judge, refused by every table, the
export and the report, and shown as SEAL BROKEN by the viewer."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from agent.rundir.grades import BrokenGrades, grades_of, read_grades
from agent.rundir.lines import seal
from tests.conftest import REPO
from tests.guards import HANG_GUARD_S

pytestmark = pytest.mark.slow  # seconds of set-up each on a busy 2-core machine: the full suite runs it, the quick loop not


def _cmd(*args):
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=HANG_GUARD_S)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    run = tmp_path_factory.mktemp("seals") / "run"
    assert _cmd("agent.run", "--method", "direct", "--backend", "scripted", "--limit", "6", "--out", str(run),
                "--no-progress").returncode == 0
    assert _cmd("agent.judge", str(run), "--judge", "exact", "--no-progress").returncode == 0
    return run


def _sed(graded, tmp_path, rewrite_answer: bool):
    """Every INCORRECT grade turned CORRECT with ``sed`` (and, optionally, its answer made the gold), then
    ``cp -r``: the attack of issue 68."""
    src = tmp_path / "edited"
    shutil.copytree(graded, src)
    f = src / "judge-exact.jsonl"
    data = f.read_text()
    assert '"grade":"INCORRECT"' in data  # the scripted demo gets some wrong: the edit below changes grades
    out = []
    for raw in data.splitlines():
        if '"grade":"INCORRECT"' in raw:
            raw = raw.replace('"grade":"INCORRECT"', '"grade":"CORRECT"')
            if rewrite_answer:
                rec = json.loads(raw)
                raw = raw.replace(json.dumps(rec["answer"]), json.dumps(rec["gold"]))
        out.append(raw)
    f.write_text("\n".join(out) + "\n")
    run = tmp_path / "copied"
    subprocess.run(["cp", "-r", str(src), str(run)], check=True)
    return run


@pytest.mark.parametrize("rewrite_answer", [False, True])
def test_an_edited_grade_is_caught_by_every_reader_and_graded_again(graded, tmp_path, rewrite_answer):
    run = _sed(graded, tmp_path, rewrite_answer)
    before = {(r.sample_id, r.trial): r.grade for r in read_grades(graded / "judge-exact.jsonl")}
    wrong = sorted(k for k, g in before.items() if g == "INCORRECT")
    rep = _cmd("agent.rundir", "check", str(run))
    assert rep.returncode == 1 and "DAMAGED" in rep.stdout and "judge-exact.jsonl: line(s)" in rep.stdout
    assert "changed since written" in rep.stdout
    for args in (["analysis.report", "--runs", str(run), "--judge", "exact", "--out", str(tmp_path / "fig")],
                 ["agent.rundir", "export", str(run), str(tmp_path / "export")]):
        r = _cmd(*args)
        assert r.returncode == 2 and "judge-exact.jsonl: line(s)" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "export").exists()
    with pytest.raises(BrokenGrades, match="not counted in any table"):
        grades_of(run, "exact")
    shown = _cmd("agent.show", str(run), wrong[0][0])
    assert shown.returncode == 0 and "grade SEAL BROKEN" in shown.stdout and "SEAL BROKEN" in shown.stderr
    # the judge sets the edited grades aside (kept, as they were) and grades those units again
    j = _cmd("agent.judge", str(run), "--judge", "exact", "--no-progress")
    assert j.returncode == 0 and "set aside" in j.stderr and f"{len(before) - len(wrong)} already graded" in j.stderr
    assert (run / "quarantine" / "judge-exact.jsonl").read_text().count('"grade":"CORRECT"') == len(wrong)
    recs, _ = grades_of(run, "exact")
    assert {(r.sample_id, r.trial): r.grade for r in recs} == before
    assert _cmd("agent.rundir", "check", str(run)).returncode == 0


def test_a_grade_of_another_line_is_not_that_lines_grade(graded, tmp_path):
    """A grade copied onto another unit and sealed again holds: but it names another line's seal as its source."""
    run = tmp_path / "run"
    shutil.copytree(graded, run)
    recs = read_grades(run / "judge-exact.jsonl")
    right = next(r for r in recs if r.grade == "CORRECT")
    victim = next(r for r in recs if r.grade != "CORRECT")
    forged = right.as_recorded() | {"sample_id": victim.sample_id, "trial": victim.trial}
    with open(run / "judge-exact.jsonl", "ab") as f:
        f.write(seal(forged) + b"\n")
    with pytest.raises(BrokenGrades, match="grade\\(s\\) result line\\(s\\) the run does not hold"):
        grades_of(run, "exact")
    rep = _cmd("agent.rundir", "check", str(run))
    assert rep.returncode == 1 and f"line(s) {len(recs) + 1} grade(s)" in rep.stdout
    again = tmp_path / "again"
    shutil.copytree(run, again)
    fixed = _cmd("agent.rundir", "check", str(run), "--repair")
    assert "moved to quarantine/judge-exact.jsonl" in fixed.stdout
    assert _cmd("agent.rundir", "check", str(run)).returncode == 0
    j = _cmd("agent.judge", str(again), "--judge", "exact", "--no-progress")  # or the judge sets it aside itself
    assert j.returncode == 0 and "set aside" in j.stderr and _cmd("agent.rundir", "check", str(again)).returncode == 0
    got, _ = grades_of(run, "exact")
    assert {(r.sample_id, r.trial): r.grade for r in got}[(victim.sample_id, victim.trial)] == victim.grade


def test_a_sealed_grade_that_is_no_valid_grade_record_is_never_counted_and_graded_again(graded, tmp_path):
    """A grade whose seal holds but whose fields its model refuses (another version's, or edited and sealed again)
    is not a grade: every reader leaves it out and says so (never a traceback), and the judge sets it aside."""
    run = tmp_path / "run"
    shutil.copytree(graded, run)
    first = json.loads((run / "judge-exact.jsonl").read_bytes().splitlines()[0])
    victim = {k: v for k, v in first.items() if k not in ("line_sha256", "reason")}
    lines = [ln for ln in (run / "judge-exact.jsonl").read_bytes().splitlines() if json.loads(ln)["sample_id"] !=
             first["sample_id"]]
    (run / "judge-exact.jsonl").write_bytes(b"".join(ln + b"\n" for ln in lines) + seal(victim) + b"\n")
    assert first["sample_id"] not in {g.sample_id for g in read_grades(run / "judge-exact.jsonl")}
    rep = _cmd("agent.rundir", "check", str(run))
    assert rep.returncode == 1 and "no valid grade record" in rep.stdout and "Traceback" not in rep.stderr
    shown = _cmd("agent.show", str(run), first["sample_id"])
    assert shown.returncode == 0 and "grade SEAL BROKEN" in shown.stdout, shown.stderr
    with pytest.raises(BrokenGrades, match="no valid grade record"):
        grades_of(run, "exact")
    j = _cmd("agent.judge", str(run), "--judge", "exact", "--no-progress")
    assert j.returncode == 0 and "set aside" in j.stderr
    assert _cmd("agent.rundir", "check", str(run)).returncode == 0
    assert first["sample_id"] in {r.sample_id for r in grades_of(run, "exact")[0]}
