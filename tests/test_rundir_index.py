"""The run index (results.index.jsonl): runs are listed without parsing their lines, and the index is only a
cache — whatever it does not cover, or covers wrongly, is read from results.jsonl itself."""
from __future__ import annotations

import json

import pytest

from agent import run as runner
from agent.rundir import RunDir, check_run, load_run


@pytest.fixture
def run_dir(tmp_path):
    out = tmp_path / "r"
    assert runner.main(["--method", "react", "--backend", "scripted", "--out", str(out), "--no-progress"]) == 0
    return out


def _truth(out):
    return [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines() if x.strip()]


def test_the_writer_indexes_every_line(run_dir):
    idx = (run_dir / "results.index.jsonl").read_text().splitlines()
    assert json.loads(idx[0])["index"] == 1 and len(idx) == 1 + 6
    run = load_run(run_dir)
    truth = _truth(run_dir)
    assert [(e["sample_id"], e["trial"]) for e in run.index] == [(t["sample_id"], t["trial"]) for t in truth]
    assert all("events" not in e and "messages" not in e and e["calls"] for e in run.index)   # summaries
    # whole lines are read on access, one at a time, and equal the file's
    for got, want in zip(run.lines, truth):
        assert {k: v for k, v in got.items() if not k.startswith("_")} == want
    assert run.full(run.index[2])["events"] == truth[2]["events"]


def test_index_is_a_cache(run_dir, capsys):
    truth = _truth(run_dir)
    keys = [(t["sample_id"], t["trial"]) for t in truth]
    # gone: rebuilt from results.jsonl
    (run_dir / "results.index.jsonl").unlink()
    assert [(e["sample_id"], e["trial"]) for e in load_run(run_dir).index] == keys
    assert (run_dir / "results.index.jsonl").exists()
    # a line the index lacks (a crash between the two writes; an older run resumed): parsed from the file
    extra = dict(truth[0], trial=7)
    with open(run_dir / "results.jsonl", "a") as f:
        f.write(json.dumps(extra) + "\n")
    got = load_run(run_dir).index
    assert [(e["sample_id"], e["trial"]) for e in got] == keys + [(extra["sample_id"], 7)]
    # a torn last line is reported and skipped
    with open(run_dir / "results.jsonl", "a") as f:
        f.write('{"sample_id": "demo_1", "tri')
    assert len(load_run(run_dir).index) == 7 and "torn or malformed" in capsys.readouterr().err
    # stale offsets (the file rewritten in place, same inode): detected, the lines are read again
    data = (run_dir / "results.jsonl").read_bytes()
    with open(run_dir / "results.jsonl", "r+b") as f:
        f.write(b"\n" * 10 + data[:-len('{"sample_id": "demo_1", "tri')])
    assert [(e["sample_id"], e["trial"]) for e in load_run(run_dir).index] == keys + [(extra["sample_id"], 7)]


def test_repair_rewrites_and_the_index_follows(run_dir):
    with open(run_dir / "results.jsonl", "ab") as f:
        f.write(b'{"torn": ')
    load_run(run_dir)
    rep = check_run(run_dir, repair=True)
    assert rep.repaired and not rep.torn
    assert [(e["sample_id"], e["trial"]) for e in load_run(run_dir).index] == \
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
    with open(run_dir / "results.jsonl", "a") as f:
        f.write(json.dumps(redo) + "\n")
    latest = RunDir(run_dir).latest()
    assert latest[(redo["sample_id"], redo["trial"])]["status"] == "no_answer" and len(latest) == 6


def test_a_projecting_reader_keeps_what_it_asks_for_and_reads_whole_lines_on_access(run_dir, capsys):
    """``load_run(path, project=f)``: each summary is cut to f's fields (plus the unit's key and position) as the
    index is read, from the index or from results.jsonl alike; whole lines still read, changed lines still left out,
    and the index file is never rewritten by such a reader."""
    from agent.show.data import run_summary, view_fields

    truth = _truth(run_dir)
    full = load_run(run_dir)
    run = load_run(run_dir, project=view_fields)
    want = set(view_fields(full.index[0])) | {"sample_id", "trial", "_o", "_n", "_h"}
    assert all(set(e) == want for e in run.index) and len(run.index) == len(truth)
    assert run.full(run.index[3])["events"] == truth[3]["events"]
    assert run_summary(run) == run_summary(full)  # the viewer's numbers from the projection
    (run_dir / "results.index.jsonl").unlink()  # scanned from results.jsonl: projected the same, nothing written
    assert load_run(run_dir, project=view_fields).index == run.index
    assert not (run_dir / "results.index.jsonl").exists()
    load_run(run_dir)  # a full reader rebuilds it
    data = bytearray((run_dir / "results.jsonl").read_bytes())
    at = data.index(b'"answer"', full.index[1]["_o"])
    data[at + 1] = ord("A")  # damaged in place, same length
    (run_dir / "results.jsonl").write_bytes(bytes(data))
    got = load_run(run_dir, project=view_fields)
    assert [e["sample_id"] for e in got.index] == [e["sample_id"] for e in run.index if e["_o"] != full.index[1]["_o"]]
    assert "changed since they were written" in capsys.readouterr().err
