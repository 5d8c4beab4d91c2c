"""A one-node Slurm cluster for the tests: munged, slurmctld and slurmd on localhost, started and stopped here.

Debian's packages (slurmctld, slurmd, slurm-client, munge; scripts/test.sh installs them where apt-get can). The
daemons run as root (slurmd starts each job as its user), on ports chosen free, with every file under one
directory: their own munge key and socket, slurm.conf, state, spool and logs. Clients reach this cluster through
``SLURM_CONF`` (:meth:`Cluster.env`), so nothing of the machine's own Slurm, if any, is touched.

The node declares 16 CPUs and 64 GB (``SlurmdParameters=config_overrides``), so the four tasks of
``scripts/slurm_array.sh`` (4 CPUs, 16 GB each) are scheduled at once as on a cluster's node; the machine's real
cores are shared among them.
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

from tests.guards import HANG_GUARD_S

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "scancel", "scontrol", "sinfo", "squeue")


def unavailable() -> str | None:
    """Why a one-node cluster cannot run here (one line), or None."""
    missing = [b for b in BINARIES if shutil.which(b) is None and not Path(f"/usr/sbin/{b}").exists()]
    if missing:
        return (f"Slurm is not installed ({', '.join(missing)} not found; scripts/test.sh installs Debian's "
                "slurmctld, slurmd, slurm-client and munge where apt-get can)")
    if os.geteuid() != 0:
        return "a one-node Slurm cluster runs its daemons as root, and these tests do not run as root"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _exe(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class Cluster:
    """``with Cluster(root) as c:`` the daemons are up and the node idle; on exit they are stopped."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.node = socket.gethostname().split(".")[0]
        self.procs: list[subprocess.Popen] = []

    def env(self, **extra) -> dict:
        return {**os.environ, "SLURM_CONF": str(self.root / "slurm.conf"), **extra}

    def _conf(self) -> str:
        r = self.root
        return "\n".join([
            "ClusterName=mmcftest", f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}", "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={r / 'munge' / 'munge.sock'}",
            f"StateSaveLocation={r / 'state'}", f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}", f"SlurmdPidFile={r / 'slurmd.pid'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}", f"SlurmdLogFile={r / 'log' / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none", "SchedulerType=sched/backfill",
            "SchedulerParameters=sched_interval=1", "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU_Memory", "SlurmdParameters=config_overrides", "ReturnToService=2",
            "MpiDefault=none", "MinJobAge=3600",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs=16 RealMemory=65536 State=UNKNOWN",
            f"PartitionName=test Nodes={self.node} Default=YES MaxTime=INFINITE State=UP", ""])

    def __enter__(self) -> "Cluster":
        r = self.root
        for d in ("munge", "state", "spool", "log"):
            (r / d).mkdir(parents=True, exist_ok=True)
        (r / "munge").chmod(0o700)
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        (r / "slurm.conf").write_text(self._conf())
        m = r / "munge"
        subprocess.run([_exe("munged"), "--force", f"--key-file={key}", f"--socket={m / 'munge.sock'}",
                        f"--pid-file={m / 'munged.pid'}", f"--log-file={r / 'log' / 'munged.log'}",
                        f"--seed-file={m / 'seed'}"], check=True, capture_output=True, timeout=HANG_GUARD_S)
        try:
            for cmd in ([_exe("slurmctld"), "-D"], [_exe("slurmd"), "-D", "-N", self.node]):
                log = open(r / "log" / f"{Path(cmd[0]).name}.out", "wb")
                self.procs.append(subprocess.Popen(cmd, env=self.env(), stdout=log, stderr=subprocess.STDOUT))
            self.wait(lambda: self.run("sinfo", "-h", "-o", "%T").stdout.strip() == "idle", "the node to be idle")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        # no job outlives the cluster (a job's step is its own process, which a daemon's shutdown leaves running)
        subprocess.run([_exe("scancel"), "--partition=test"], env=self.env(), capture_output=True, timeout=60)
        end = time.monotonic() + 60
        while time.monotonic() < end and self.run("squeue", "-h").stdout.strip():
            time.sleep(0.2)
        subprocess.run([_exe("scontrol"), "shutdown"], env=self.env(), capture_output=True, timeout=60)
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        subprocess.run([_exe("munged"), "--stop", f"--socket={self.root / 'munge' / 'munge.sock'}"],
                       capture_output=True, timeout=60)

    def run(self, cmd: str, *args, cwd=None, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([_exe(cmd), *args], env=self.env(**(env or {})), cwd=cwd, capture_output=True,
                              text=True, timeout=HANG_GUARD_S)

    def wait(self, done, what: str) -> None:
        """Poll ``done()`` until true; past the hang guard, fail naming what was awaited and the daemons' logs."""
        end = time.monotonic() + HANG_GUARD_S
        while not done():
            if time.monotonic() > end or any(p.poll() is not None for p in self.procs):
                logs = "\n".join(f"{f.name}: {f.read_text(errors='replace')[-1500:]}"
                                 for f in sorted((self.root / "log").iterdir()))
                raise AssertionError(f"Slurm: gave up waiting for {what}\n{logs}")
            time.sleep(0.2)

    def state(self, job: str) -> str:
        """A job's (or an array task's, ``JOBID_I``) state: PENDING, RUNNING, COMPLETED, CANCELLED, FAILED..."""
        out = self.run("scontrol", "show", "job", "-o", job).stdout
        m = re.search(r"JobState=(\S+)", out)
        return m.group(1) if m else "UNKNOWN"

    def states(self, job: str) -> dict[str, str]:
        """Every task of an array job: ``{"JOBID_I": state}``."""
        out = self.run("scontrol", "show", "job", "-o", job).stdout
        return {f"{a}_{t}": s for a, t, s in
                re.findall(r"ArrayJobId=(\d+) ArrayTaskId=(\d+).*?JobState=(\S+)", out)}
