"""The launcher's processes: starting one in its own process group with its log, waiting until it is ready,
knowing whether a recorded PID is still the process that was started, and stopping a group.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from agent.errors import UsageError


class LaunchError(UsageError, RuntimeError):
    """A launch that cannot work as asked: said before anything starts."""


# ------------------------------------------------------------------ launching
def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a zombie (exited, not yet reaped) is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return True


def last_line(log: str) -> str:
    try:
        with open(log, "rb") as f:
            f.seek(max(0, os.path.getsize(log) - 4000))
            lines = [x for x in f.read().decode(errors="replace").splitlines() if x.strip()]
        return lines[-1][-160:] if lines else "(no output yet)"
    except OSError:
        return "(no log yet)"


def wait_ready(url: str, proc: subprocess.Popen, log: str, name: str, timeout: float, every: float = 15,
               health: str = "/health_generate") -> str:
    """Wait for ``health`` (SGLang's /health_generate: a generation went through; vLLM's /health) then /v1/models;
    show progress; returns the served model id."""
    t0 = time.time()
    next_note, last = t0 + every, ""
    while time.time() - t0 < timeout:
        if proc.poll() is not None or not alive(proc.pid):
            tail = open(log, errors="replace").read()[-2000:] if os.path.exists(log) else ""
            raise LaunchError(f"{name}: the server exited before it was ready; last log lines ({log}):\n{tail}")
        try:
            urllib.request.urlopen(url + health, timeout=10).read()
            models = json.load(urllib.request.urlopen(url + "/v1/models", timeout=10))
            return models["data"][0]["id"]
        except Exception as e:  # noqa: BLE001 - not up yet
            last = str(e)
        if time.time() >= next_note:
            print(f"  waiting for {name}: {time.time() - t0:.0f} s; last log line: {last_line(log)}", flush=True)
            next_note = time.time() + every
        time.sleep(2 if timeout > 30 else 0.2)
    raise LaunchError(f"{name}: not ready after {timeout:g}s ({url}{health}: {last}); see {log}")


def start(cmd: list[str], env: dict, log: str) -> subprocess.Popen:
    with open(log, "wb") as f:
        return subprocess.Popen(cmd, env={**os.environ, **env}, stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def proc_start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat, field 22): with the PID, it names one
    process for good (a recycled PID has another), whatever title the process gives itself (SGLang and its
    router set theirs, so the command line is no identity)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def pid_record(pid: int) -> str:
    """A PID file's text: ``PID START_TIME`` (see :func:`proc_start_time`)."""
    start = proc_start_time(pid)
    return f"{pid} {start}" if start else str(pid)


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
    except OSError:
        pass
