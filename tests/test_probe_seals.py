"""Figure 2's numbers sealed all the way to the figure (issue 80): each probe's tables and per-token files are
sealed when written (``seals.json``, bound to the rows they were computed from), and every reader — check, the
frames, the report, calibrate_unload, the viewer — refuses or flags a copied run whose probe outputs were edited
(``cp -r``, then an edit); a second grounding annotator is refused; what a killed probe left is swept."""
from __future__ import annotations

import base64
import gzip
import io
import json
import os
import re
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from agent.rundir import RunError, frames
from tests.conftest import REPO
from tests.guards import HANG_GUARD_S

pytestmark = pytest.mark.slow


def _cmd(*args, env=None):
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=HANG_GUARD_S, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """A scripted ReAct run with every probe of Figure 2 (the demo's commands)."""
    run = tmp_path_factory.mktemp("probed") / "run"
    steps = [("agent.run", "--method", "react", "--backend", "scripted", "--benchmark", "demo", "--limit", "6",
              "--out", str(run)),
             ("probes.entropy", str(run), "--backend", "scripted"),
             ("probes.entropy", str(run), "--mode", "teacher-forced", "--backend", "scripted", "--skip-fidelity"),
             ("probes.removal", str(run), "--steps", "1..2", "--backend", "scripted", "--judge", "exact"),
             ("probes.grounding", str(run), "--judge", "scripted"),
             ("agent.judge", str(run), "--judge", "exact")]
    for s in steps:
        r = _cmd(*s, "--no-progress")
        assert r.returncode == 0, (s, r.stderr[-2000:])
    return run


def _copy(probed, tmp_path):
    run = tmp_path / "copied"
    subprocess.run(["cp", "-r", str(probed), str(run)], check=True)
    return run


def _report(run, tmp_path):
    return _cmd("analysis.report", "--react", str(run), "--runs", str(run), "--judge", "exact", "--out",
                str(tmp_path / "fig"))


def test_an_intact_run_with_every_probe_checks_clean_and_reports(probed, tmp_path):
    r = _cmd("agent.rundir", "check", str(probed))
    assert r.returncode == 0 and "probe output" not in r.stdout, r.stdout
    for name in ("entropy-regenerate", "entropy-teacher-forced", "grounding", "removal"):
        seals = json.loads((probed / "probes" / name / "seals.json").read_text())
        assert seals["files"], name
    assert any(k.startswith("tokens/") for k in json.loads(
        (probed / "probes" / "entropy-teacher-forced" / "seals.json").read_text())["files"])
    assert len(frames.entropy(probed, "regenerate")) and len(frames.removal(probed))


def test_a_delta_h_edited_in_steps_parquet_is_refused_by_every_reader(probed, tmp_path):
    run = _copy(probed, tmp_path)
    f = run / "probes" / "entropy-regenerate" / "steps.parquet"
    df = pd.read_parquet(f)
    df["dH"] = 1.0
    df.to_parquet(f, index=False)
    r = _cmd("agent.rundir", "check", str(run))
    assert r.returncode == 1 and "DAMAGED" in r.stdout and "steps.parquet: changed since its probe wrote it" in r.stdout
    with pytest.raises(RunError, match="changed since its probe wrote it"):
        frames.entropy(run, "regenerate")
    rep = _report(run, tmp_path)
    assert rep.returncode != 0 and "steps.parquet" in rep.stderr and "Traceback" not in rep.stderr, rep.stderr[-2000:]
    # the probe, run again, writes its tables again from its sealed rows: every reader takes them
    assert _cmd("probes.entropy", str(run), "--backend", "scripted", "--no-progress").returncode == 0
    assert _cmd("agent.rundir", "check", str(run)).returncode == 0
    pd.testing.assert_frame_equal(frames.entropy(run, "regenerate"), frames.entropy(probed, "regenerate"))


def test_a_replay_grade_flipped_in_outcomes_csv_is_refused(probed, tmp_path):
    run = _copy(probed, tmp_path)
    f = run / "probes" / "removal" / "outcomes.csv"
    df = pd.read_csv(f)
    df["replay_correct"] = ~df["replay_correct"].astype(bool)
    df.to_csv(f, index=False)
    with pytest.raises(RunError, match="outcomes.csv: changed since its probe wrote it"):
        frames.removal(run)
    rep = _report(run, tmp_path)
    assert rep.returncode != 0 and "outcomes.csv" in rep.stderr and "Traceback" not in rep.stderr
    cal = _cmd("probes.calibrate_unload", str(run))
    assert cal.returncode != 0 and "outcomes.csv" in cal.stderr and "Traceback" not in cal.stderr, cal.stderr[-1500:]


def test_rows_edited_in_steps_jsonl_are_named_by_every_reader(probed, tmp_path):
    run = _copy(probed, tmp_path)
    f = run / "probes" / "entropy-regenerate" / "steps.jsonl"
    lines = f.read_bytes().splitlines(keepends=True)
    for i in range(min(5, len(lines))):  # the rows' ΔH rewritten in place: their own seals no longer match
        rec = json.loads(lines[i])
        lines[i] = lines[i].replace(json.dumps(rec["dH"]).encode(), b"0.999")
    f.write_bytes(b"".join(lines))
    r = _cmd("agent.rundir", "check", str(run))
    assert r.returncode == 1 and "steps.jsonl" in r.stdout and "changed since" in r.stdout, r.stdout
    with pytest.raises(RunError, match="steps.jsonl"):
        frames.entropy(run, "regenerate")
    # the probe sets them aside, computes them again and writes its tables again
    again = _cmd("probes.entropy", str(run), "--backend", "scripted", "--no-progress")
    assert again.returncode == 0 and "set aside" in again.stderr
    assert _cmd("agent.rundir", "check", str(run)).returncode == 0


def test_an_edited_per_token_file_is_flagged_by_check_and_the_viewer(probed, tmp_path):
    run = _copy(probed, tmp_path)
    tok = sorted((run / "probes" / "entropy-teacher-forced" / "tokens").glob("*.parquet"))[0]
    df = pd.read_parquet(tok)
    df["dH"] = 7.77
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    tok.write_bytes(buf.getvalue())
    r = _cmd("agent.rundir", "check", str(run))
    assert r.returncode == 1 and f"{tok.name}: changed since its probe wrote it" in r.stdout
    html = tmp_path / "view.html"
    v = _cmd("agent.show", str(run), "--html", str(html))
    assert v.returncode == 0 and "no per-token" in v.stderr and tok.name in v.stderr, v.stderr[-1500:]
    page = (tmp_path / "view_files" / tok.name.replace(".parquet", ".html")).read_text()
    blobs = [gzip.decompress(base64.b64decode(b)).decode() for b in re.findall(r'"(H4sI[A-Za-z0-9+/=]+)"', page)]
    assert blobs and any('"warnings":["no per-token' in b for b in blobs) and not any('"dH":[777' in b for b in blobs)


def test_a_damaged_sidecar_is_said_by_the_viewer(probed, tmp_path):
    run = _copy(probed, tmp_path)
    side = sorted((run / "tokens").glob("*.parquet"))[0]
    side.write_bytes(side.read_bytes()[:-20] + b"\0" * 20)
    html = tmp_path / "view.html"
    v = _cmd("agent.show", str(run), "--html", str(html))
    assert v.returncode == 0 and "no tokens shown" in v.stderr and side.name in v.stderr, v.stderr[-1500:]
    page = (tmp_path / "view_files" / (side.name.split("__t")[0] + "__t0.html")).read_text()
    blobs = [gzip.decompress(base64.b64decode(b)).decode() for b in re.findall(r'"(H4sI[A-Za-z0-9+/=]+)"', page)]
    assert any('"warnings":["no tokens shown' in b for b in blobs)  # the page says why its tokens are missing


def test_a_second_grounding_annotator_on_one_run_is_refused(probed, tmp_path):
    from agent.rundir import output_lock

    run = _copy(probed, tmp_path)
    shutil.rmtree(run / "probes" / "grounding")
    with output_lock(run / "probes" / "grounding", "grounding annotator"):  # the first one, still at work
        r = _cmd("probes.grounding", str(run), "--judge", "scripted", "--no-progress")
    assert r.returncode == 2 and "another grounding annotator is writing here" in r.stderr
    assert not (run / "probes" / "grounding" / "labels.jsonl").exists()


def test_what_a_killed_probe_left_is_swept_and_a_replay_dir_is_checked_as_one(probed, tmp_path):
    run = _copy(probed, tmp_path)
    out = run / "probes" / "entropy-regenerate"
    dead = 2 ** 22 + 12345  # no such process
    for name in (f"steps.parquet.tmp{dead}-1", f"tokens/x.parquet.tmp{dead}-2"):
        (out / name).parent.mkdir(exist_ok=True)
        (out / name).write_bytes(b"half")
    assert _cmd("probes.entropy", str(run), "--backend", "scripted", "--no-progress").returncode == 0
    assert not list(out.rglob(f"*.tmp{dead}-*"))
    k1 = _cmd("agent.rundir", "check", str(run / "probes" / "removal" / "k1"))
    assert k1.returncode == 0 and "missing units" not in k1.stdout and "agent.run" not in k1.stderr, k1.stdout


@pytest.mark.parametrize("probe", ["entropy-regenerate", "entropy-teacher-forced", "removal"])
def test_a_probe_killed_again_and_again_finishes_with_nothing_lost_doubled_or_left_behind(tmp_path, tiny_model_dir,
                                                                                        probe):
    """kill -9 while it works, twice, then to the end: every step once, the outputs sealed, no temporary left
    (issue 80). A slow loopback SGLang keeps each probe at work long enough to be killed mid-way."""
    import signal
    import time

    from serving.fakes.policy import agent_policy
    from serving.fakes.sglang_server import FakeSGLang
    from tests.records import record_react_run

    run = tmp_path / "run"
    record_react_run(run, tiny_model_dir, limit=2)
    args = {"entropy-regenerate": ["probes.entropy", str(run), "--skip-fidelity"],
            "entropy-teacher-forced": ["probes.entropy", str(run), "--mode", "teacher-forced", "--skip-fidelity"],
            "removal": ["probes.removal", str(run), "--steps", "1..2", "--judge", "exact"]}[probe]
    rows = run / "probes" / probe / ("steps.jsonl" if probe != "removal" else "k1/results.jsonl")
    with FakeSGLang(reply=agent_policy, tokenizer_dir=str(tiny_model_dir), model_name=str(tiny_model_dir),
                    latency_s=0.05) as srv:
        cmd = [sys.executable, "-m", *args, "--backend", "sglang", "--endpoint", srv.url, "--model-dir",
               str(tiny_model_dir), "--include-unparsed", "--concurrency", "1", "--no-progress"]
        if probe == "removal":
            cmd.remove("--include-unparsed")
        for kill in range(2):
            p = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            seen = len(rows.read_bytes().splitlines()) if rows.exists() else 0
            end = time.monotonic() + HANG_GUARD_S
            while p.poll() is None and time.monotonic() < end:  # a new row since the last kill: kill it now
                if rows.exists() and len(rows.read_bytes().splitlines()) > seen:
                    break
                time.sleep(0.02)
            p.send_signal(signal.SIGKILL)
            p.wait()
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stderr[-2000:]
    out = run / "probes" / probe
    assert not [x for x in out.rglob("*") if ".tmp" in x.name]
    r = _cmd("agent.rundir", "check", str(run))
    assert r.returncode == 0 and "probe output" not in r.stdout, r.stdout[-2000:]
    if probe != "removal":
        keys = [(j["sample_id"], j["trial"], j["step"]) for j in map(json.loads, rows.read_bytes().splitlines())]
        assert len(keys) == len(set(keys)) == len(frames.entropy(run, probe.split("-", 1)[1]))
    else:
        o = frames.removal(run)
        assert len(o) == len(o.drop_duplicates(["sample_id", "trial", "k"]))
