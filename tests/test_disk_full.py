"""A full disk under the runner, the judge and the probe (issue 68), on a real small filesystem (tmpfs, as root):
each command ends in one line that names what is full (the file where the error names one) and how to resume, exit
5, with no traceback and no "never awaited" warning; the resume finishes, heals what the cut left (a torn grade is
set aside and graded again) and leaves no temporary or orphaned file behind."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from agent.rundir import check_run
from serving.fakes.policy import agent_policy
from serving.fakes.sglang_server import FakeSGLang
from tests.conftest import REPO
from tests.guards import HANG_GUARD_S

pytestmark = pytest.mark.slow


@pytest.fixture
def disk(tmp_path):
    """A 1 MB tmpfs, resized by ``disk.size(mb)``; skipped where it cannot be mounted (CI runs as root)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                                           capture_output=True).returncode:
        pytest.skip("needs root to mount a small tmpfs (CI runs as root)")

    class Disk:
        path = mnt

        def size(self, mb: int) -> None:
            subprocess.run(["mount", "-o", f"remount,size={mb}m", str(mnt)], check=True)

        def fill(self, leave_kb: int) -> None:
            st = os.statvfs(mnt)
            with open(mnt / "ballast", "wb") as f:
                f.write(b"\0" * max(st.f_bavail * st.f_frsize - leave_kb * 1024, 0))

        def free(self) -> None:
            (mnt / "ballast").unlink()

    try:
        yield Disk()
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


@pytest.fixture
def server(tiny_model_dir):
    with FakeSGLang(reply=agent_policy, tokenizer_dir=str(tiny_model_dir), model_name=str(tiny_model_dir)) as srv:
        yield srv


def _cmd(*args):
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=HANG_GUARD_S)


def _one_line(r, names: str) -> None:
    """The command ended on a full disk: exit 5, one error line naming ``names`` and the resume, nothing else."""
    assert r.returncode == 5, r.stderr[-3000:]
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {names}: the disk is full"), r.stderr[-3000:]
    assert "rerun the same command to resume" in errors[0]
    assert "Traceback" not in r.stderr and "never awaited" not in r.stderr and "Unclosed" not in r.stderr, r.stderr[-3000:]


def _runner(server, tiny_model_dir, out, *extra):
    return _cmd("agent.run", "--method", "react", "--backend", "sglang", "--endpoint", server.url, "--model-dir",
                str(tiny_model_dir), "--t-max", "3", "--out", str(out), "--no-progress", *extra)


def test_the_runner_on_a_full_disk_says_one_line_and_its_resume_leaves_nothing_behind(disk, server, tiny_model_dir):
    run = disk.path / "run"
    r = _runner(server, tiny_model_dir, run, "--trials", "20", "--concurrency", "32")
    _one_line(r, str(run))  # the run directory, or the file in it
    disk.size(64)
    assert _runner(server, tiny_model_dir, run, "--trials", "20", "--concurrency", "32").returncode == 0
    rep = check_run(run)
    assert rep.intact and rep.complete and not rep.temp_files and not rep.orphans, "\n".join(rep.lines())
    assert not [p for p in run.rglob("*") if ".tmp" in p.name]


def test_the_judge_and_the_probe_on_a_full_disk_name_their_file_and_resume(disk, server, tiny_model_dir):
    run = disk.path / "run"
    disk.size(64)
    assert _runner(server, tiny_model_dir, run, "--limit", "6", "--trials", "8").returncode == 0
    disk.fill(leave_kb=16)
    assert check_run(run).cache in ("ok", "absent")  # an intact tool cache reads as intact on a full disk
    _one_line(_cmd("agent.judge", str(run), "--judge", "exact", "--no-progress"), str(run / "judge-exact.jsonl"))
    # an LLM judge (its HTTP client open) ends as cleanly: its client closed, nothing said after its one line
    llm = _cmd("agent.judge", str(run), "--judge-endpoint", server.url, "--judge-model", "judge", "--judge-name",
               "served", "--no-progress")
    _one_line(llm, str(run / "judge-served.jsonl"))
    probe = ("probes.entropy", str(run), "--mode", "teacher-forced", "--backend", "sglang", "--endpoint", server.url,
             "--model-dir", str(tiny_model_dir), "--skip-fidelity", "--no-progress")
    out = run / "probes" / "entropy-teacher-forced"
    r = _cmd(*probe)
    _one_line(r, str(out / "steps.jsonl") if "stopped:" in r.stderr else str(out))  # cut mid-probe, or before
    disk.free()
    j = _cmd("agent.judge", str(run), "--judge", "exact", "--no-progress")
    assert j.returncode == 0, j.stderr[-2000:]
    grades = (run / "judge-exact.jsonl").read_bytes().splitlines()
    assert len(grades) == 48 and all(g.endswith(b'"}') for g in grades)  # each unit graded once, none torn
    if "torn" in j.stderr:  # the cut grade, set aside where check and the judge's next run can see it
        assert (run / "quarantine" / "judge-exact.jsonl").exists() and "set aside in" in j.stderr
    p = _cmd(*probe)
    assert p.returncode == 0, p.stderr[-2000:]
    rep = check_run(run)
    assert rep.intact and rep.complete and not rep.temp_files and not rep.orphans and not rep.grades, "\n".join(rep.lines())
    assert not [x for x in run.rglob("*") if ".tmp" in x.name]
