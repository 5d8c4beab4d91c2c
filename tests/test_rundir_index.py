"""The run index (results.index.jsonl): runs are listed without parsing their lines, and the index is only a
cache — whatever it does not cover, or covers wrongly, is read from results.jsonl itself."""
from __future__ import annotations

import json

import pytest

from agent import run as runner
from agent.record import LineSummary, ResultLine
from agent.rundir import RunDir, RunError, check_run, load_run
from agent.rundir.lines import seal


@pytest.fixture
def run_dir(tmp_path):
    out = tmp_path / "r"
    assert runner.main(["--method", "react", "--backend", "scripted", "--out", str(out), "--no-progress"]) == 0
    return out


def _truth(out):
    return [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines() if x.strip()]


def test_the_writer_indexes_every_line(run_dir):
    idx = (run_dir / "results.index.jsonl").read_text().splitlines()
    assert json.loads(idx[0])["index"] == 3 and len(idx) == 1 + 6
    run = load_run(run_dir)
    truth = _truth(run_dir)
    assert [e.key for e in run.index] == [(t["sample_id"], t["trial"]) for t in truth]
    assert all(type(e) is LineSummary and e.calls for e in run.index)   # summaries: no events, no messages
    # whole lines are read on access, one at a time, as their model, and hold what the file holds
    for got, want in zip(run.lines, truth):
        assert isinstance(got, ResultLine) and got.as_recorded() == want  # nothing of the index rides along
    assert run.full(run.index[2]).as_recorded()["events"] == truth[2]["events"]


def test_index_is_a_cache(run_dir, capsys):
    truth = _truth(run_dir)
    keys = [(t["sample_id"], t["trial"]) for t in truth]
    # gone: rebuilt from results.jsonl
    (run_dir / "results.index.jsonl").unlink()
    assert [e.key for e in load_run(run_dir).index] == keys
    assert (run_dir / "results.index.jsonl").exists()
    # a line the index lacks (a crash between the two writes; an older run resumed): parsed from the file
    extra = dict(truth[0], trial=7)
    with open(run_dir / "results.jsonl", "ab") as f:
        f.write(seal(extra) + b"\n")
    got = load_run(run_dir).index
    assert [e.key for e in got] == keys + [(extra["sample_id"], 7)]
    # a torn last line is reported and skipped
    with open(run_dir / "results.jsonl", "a") as f:
        f.write('{"sample_id": "demo_1", "tri')
    assert len(load_run(run_dir).index) == 7 and "torn or malformed" in capsys.readouterr().err
    # stale offsets (the file rewritten in place, same inode): detected, the lines are read again
    data = (run_dir / "results.jsonl").read_bytes()
    with open(run_dir / "results.jsonl", "r+b") as f:
        f.write(b"\n" * 10 + data[:-len('{"sample_id": "demo_1", "tri')])
    assert [e.key for e in load_run(run_dir).index] == keys + [(extra["sample_id"], 7)]


def test_repair_rewrites_and_the_index_follows(run_dir):
    with open(run_dir / "results.jsonl", "ab") as f:
        f.write(b'{"torn": ')
    load_run(run_dir)
    rep = check_run(run_dir, repair=True)
    assert rep.repaired and not rep.torn
    assert [e.key for e in load_run(run_dir).index] == \
        [(t["sample_id"], t["trial"]) for t in _truth(run_dir)]
    # and the runner resumes from it: nothing to do
    assert runner.main(["--method", "react", "--backend", "scripted", "--out", str(run_dir), "--no-progress"]) == 0
    assert len(_truth(run_dir)) == 6


def test_an_unwritable_index_is_done_without(run_dir):
    (run_dir / "results.index.jsonl").unlink()
    (run_dir / "results.index.jsonl").mkdir()  # cannot be read or written (as on a read-only copy)
    assert len(load_run(run_dir).index) == 6


def test_latest_line_per_unit_wins(run_dir):
    truth = _truth(run_dir)
    redo = dict(truth[1], status="no_answer", answer="")
    with open(run_dir / "results.jsonl", "ab") as f:
        f.write(seal(redo) + b"\n")
    latest = RunDir(run_dir).latest()
    assert latest[(redo["sample_id"], redo["trial"])]["status"] == "no_answer" and len(latest) == 6


def test_a_projecting_reader_keeps_what_it_asks_for_and_reads_whole_lines_on_access(run_dir, capsys):
    """``load_run(path, fields=...)``: each summary holds those fields (plus the unit's key and seal) as the index
    is read, from the index or from results.jsonl alike; whole lines still read, changed lines still left out, and
    the index file is never rewritten by such a reader."""
    from agent.show.data import VIEW_FIELDS, run_summary

    truth = _truth(run_dir)
    full = load_run(run_dir)
    run = load_run(run_dir, fields=VIEW_FIELDS)
    want = set(VIEW_FIELDS) | {"sample_id", "trial", "line_sha256"}
    assert all(e.model_fields_set == want for e in run.index) and len(run.index) == len(truth)
    assert [e.answer for e in run.index] == [e.answer for e in full.index]
    with pytest.raises(AttributeError):
        run.index[0].calls  # a field it did not keep is not there (never a default in its place)
    assert run.full(run.index[3]).as_recorded()["events"] == truth[3]["events"]
    assert run_summary(run) == run_summary(full)  # the viewer's numbers from the projection
    (run_dir / "results.index.jsonl").unlink()  # scanned from results.jsonl: projected the same, nothing written
    assert load_run(run_dir, fields=VIEW_FIELDS).index == run.index
    assert not (run_dir / "results.index.jsonl").exists()
    load_run(run_dir)  # a full reader rebuilds it
    data = bytearray((run_dir / "results.jsonl").read_bytes())
    seal_at = data.index(full.index[1].line_sha256.encode())
    at = data.rindex(b'"answer"', 0, seal_at)
    data[at + 1] = ord("A")  # damaged in place, same length
    (run_dir / "results.jsonl").write_bytes(bytes(data))
    got = load_run(run_dir, fields=VIEW_FIELDS)
    assert [e.sample_id for e in got.index] == [e.sample_id for e in run.index if e.key != full.index[1].key]
    assert "changed since they were written" in capsys.readouterr().err


def _edit_answer(run_dir, new: bytes) -> str:
    """Change the first line's answer in place, keeping it valid JSON of the same length (as ``sed -i`` would)."""
    res = run_dir / "results.jsonl"
    data = res.read_bytes()
    first = json.loads(data[:data.index(b"\n")])
    old = json.dumps(first["answer"]).encode()
    assert old in data[:data.index(b"\n")] and len(new) == len(old)
    res.write_bytes(data.replace(old, new, 1))
    return first["sample_id"]


@pytest.mark.parametrize("how", ["in place", "cp -r", "tar", "index deleted"])
def test_an_edited_line_is_caught_wherever_the_run_is_copied(run_dir, tmp_path, how, capsys):
    """The checksum travels in the line itself: an edit is reported by check and left out by every reader after
    ``cp -r``, a tar round trip or a deleted index, not only in place (issue 55, item 3); a missing index on a run
    that had lines is reported."""
    import shutil
    import subprocess

    first = json.loads((run_dir / "results.jsonl").read_bytes().splitlines()[0])
    victim = _edit_answer(run_dir, json.dumps("Z" * len(first["answer"])).encode())
    where = run_dir
    if how == "cp -r":
        where = tmp_path / "copy"
        shutil.copytree(run_dir, where)
    elif how == "tar":
        where = tmp_path / "untarred"
        where.mkdir()
        subprocess.run(f"tar -C {run_dir} -cf - . | tar -C {where} -xf -", shell=True, check=True)
    elif how == "index deleted":
        (run_dir / "results.index.jsonl").unlink()
    rep = check_run(where)
    assert not rep.intact and [u for _, u in rep.changed] == [f"{victim}/t0"]
    assert victim not in {k[0] for k in RunDir(where).done_keys()}  # its unit reruns on resume
    assert victim not in {e.sample_id for e in load_run(where).index}
    assert "changed since they were written" in capsys.readouterr().err
    if how == "index deleted":
        assert rep.index.startswith("MISSING")


def test_a_sealed_line_that_is_no_valid_record_is_refused_naming_it(run_dir, tmp_path):
    """A line whose seal holds but whose fields its model refuses (written by another version, or crafted and sealed
    again) is never read as a record: every reader stops on it with the file, the unit and the field, no traceback."""
    import subprocess
    import sys

    lines = _truth(run_dir)
    bad = {k: v for k, v in lines[1].items() if k not in ("n_calls", "line_sha256")}
    (run_dir / "results.jsonl").write_bytes(b"".join(seal(ln) + b"\n" for ln in [lines[0], bad, *lines[2:]]))
    (run_dir / "results.index.jsonl").unlink()
    with pytest.raises(RunError, match=r"results.jsonl \(demo_\w+ trial 0\): not a valid summary record.*n_calls"):
        load_run(run_dir)
    r = subprocess.run([sys.executable, "-m", "agent.show", str(run_dir)], capture_output=True, text=True)
    assert r.returncode == 2 and "n_calls" in r.stderr and "Traceback" not in r.stderr, r.stderr
