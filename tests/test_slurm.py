"""scripts/slurm_array.sh under a real Slurm: a one-node cluster (tests/slurm_cluster.py) runs the four shards of a
run as one array job against a loopback SGLang; one task is cancelled mid-run and resubmitted; the merge of the
four shards is the unsharded run, every unit once. Skipped, with its reason, where Slurm cannot run."""
from __future__ import annotations

import subprocess
import sys

import pytest

from agent.backends.base import routing_key
from agent.rundir import check_run, load_run
from agent.rundir.shards import shard_units
from serving.fakes.policy import agent_policy
from serving.fakes.sglang_server import FakeSGLang
from tests.conftest import REPO
from tests.slurm_cluster import Cluster, unavailable
from tests.test_shards import unit_outcomes

pytestmark = [pytest.mark.slow, pytest.mark.skipif(unavailable() is not None, reason=unavailable() or "")]

SAMPLES = [f"demo_{i}" for i in range(1, 7)]  # the demo benchmark, in manifest order
TRIALS, SHARDS = 2, 4


def test_an_array_job_with_a_task_cancelled_and_resubmitted_merges_into_the_unsharded_run(tmp_path, tiny_model_dir,
                                                                                           record_property):
    said: list[str] = []
    units = [(s, t) for t in range(TRIALS) for s in SAMPLES]  # the runner's order (agent/run/config.py all_units)
    held = shard_units(units, 1, SHARDS)[-1]  # task 1's last unit: its requests wait until the task is cancelled
    out = tmp_path / "runs" / "react-demo"
    (tmp_path / "logs").mkdir()
    with FakeSGLang(reply=agent_policy, tokenizer_dir=str(tiny_model_dir), model_name=str(tiny_model_dir)) as srv, \
            Cluster(tmp_path / "slurm") as slurm:
        srv.held_keys.add(routing_key(held))
        env = {"GATEWAY": srv.url, "MODEL_DIR": str(tiny_model_dir), "OUT": str(out), "SEED": "11",
               "TRIALS": str(TRIALS), "CONCURRENCY": "1", "EXTRA": "--limit 6 --t-max 3", "REPO": str(REPO),
               "PYTHON": sys.executable, "PYTHONPATH": str(REPO)}
        script = str(REPO / "scripts" / "slurm_array.sh")

        def sbatch(*args, **extra):
            r = slurm.run("sbatch", "--parsable", *args, script, cwd=tmp_path, env={**env, **extra})
            assert r.returncode == 0, r.stderr
            said.append(f"$ {' '.join(f'{k}={v}' for k, v in extra.items())}{' ' if extra else ''}sbatch "
                        f"{' '.join(args)} scripts/slurm_array.sh  -> job {r.stdout.strip()}")
            return r.stdout.strip().split(";")[0]

        job = sbatch(f"--array=0-{SHARDS - 1}")
        slurm.wait(lambda: routing_key(held) in srv.holding, f"task 1 to reach {held}")
        states = slurm.states(job)
        said.append("tasks: " + ", ".join(f"{k} {v}" for k, v in sorted(states.items())))
        assert sorted(states) == [f"{job}_{i}" for i in range(SHARDS)] and states[f"{job}_1"] == "RUNNING"
        r = slurm.run("scancel", f"{job}_1")
        assert r.returncode == 0, r.stderr
        slurm.wait(lambda: slurm.state(f"{job}_1") == "CANCELLED", "task 1 to be cancelled")
        said.append(f"$ scancel {job}_1  -> {slurm.state(f'{job}_1')}")
        part = check_run(f"{out}.shard-1")
        assert part.intact and not part.complete and part.present < part.expected == TRIALS * len(SAMPLES) // SHARDS
        said.append(f"react-demo.shard-1 at the cancel: {part.present} of {part.expected} units recorded")
        srv.held_keys.clear()
        slurm.wait(lambda: all(slurm.state(f"{job}_{i}") == "COMPLETED" for i in (0, 2, 3)), "tasks 0, 2, 3")
        # one task of a larger array: its size given, as docs/serving.md says
        again = sbatch("--array=1", SHARDS=str(SHARDS))
        slurm.wait(lambda: slurm.state(f"{again}_1") in ("COMPLETED", "FAILED", "CANCELLED"), "the resubmitted task")
        log = (tmp_path / "logs" / f"mmcf-shard-{again}_1.out").read_text()
        assert slurm.state(f"{again}_1") == "COMPLETED", log[-3000:]
        resumed = next(ln for ln in log.splitlines() if "already done" in ln)  # the runner's own account
        assert f"{part.present} already done, {part.expected - part.present} to run" in resumed, log[-3000:]
        account = resumed.split(": ", 1)[-1].split(" -> ")[0]
        said.append(f"resubmitted task: {slurm.state(f'{again}_1')} ({account}); the others: "
                    + ", ".join(f"{job}_{i} {slurm.state(f'{job}_{i}')}" for i in (0, 2, 3)))
        # the same run without shards, against the same server
        one = tmp_path / "runs" / "one"
        r = subprocess.run([sys.executable, "-m", "agent.run", "--method", "react", "--benchmark", "demo", "--backend",
                            "sglang", "--endpoint", srv.url, "--model-dir", str(tiny_model_dir), "--trials",
                            str(TRIALS), "--seed", "11", "--concurrency", "1", "--limit", "6", "--t-max", "3",
                            "--out", str(one), "--no-progress"], cwd=REPO, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-3000:]
    shards = [f"{out}.shard-{i}" for i in range(SHARDS)]
    r = subprocess.run([sys.executable, "-m", "agent.rundir", "merge", str(out), *shards], cwd=REPO,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    said.append(f"$ python -m agent.rundir merge {out.name} {out.name}.shard-*  -> {r.stdout.strip().splitlines()[0]}")
    rep = check_run(out)
    assert rep.intact and rep.complete and rep.present == rep.expected == len(units) and not rep.orphans, rep.lines()
    merged = load_run(out)
    assert sorted(ln.key for ln in merged.index) == sorted(units)  # each unit once
    assert unit_outcomes(out) == unit_outcomes(one)
    record_property("slurm", "\n".join(said))
