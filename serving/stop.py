"""Stop the servers (and routers) that serving/launch_qwen35.sh started, and nothing else.

    bash serving/stop.sh [--serve-dir DIR] [--timeout S]          # = python -m serving.stop

Reads DIR/*.pid (default .serve, or $MMCF_SERVE_DIR); a PID is signalled only if that process is still the
one the launcher started (the same start time as recorded beside the PID; for old PID files, a command line
carrying the port recorded in its name — SGLang and its router retitle themselves, so new files use the time). Each process group gets
SIGTERM, then SIGKILL after --timeout seconds (default 30); its entry in DIR/endpoints.json is marked
``"status": "stopped"``. With no servers in DIR, it lists the other run directories the launcher
remembers that still have live servers, with the exact command that stops them.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from agent.cli import make_parser, positive_float
from serving.endpoints import state_file
from serving.processes import alive, proc_start_time

__all__ = ["stop_dir", "main"]


def _cmdline(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None


def _read_pid(f: Path) -> tuple[int, str | None]:
    """(PID, start time or None for a PID file written before start times were recorded); ValueError if bad."""
    parts = f.read_text().split()
    return int(parts[0]), (parts[1] if len(parts) > 1 else None)


def _ours(f: Path, pid: int, start: str | None) -> bool:
    """Whether ``pid`` is still the process the launcher started: the same start time (a recycled PID has
    another), or, for an old PID file, a command line carrying the port recorded in its name."""
    if start is not None:
        return proc_start_time(pid) == start
    cmd = _cmdline(pid)
    return bool(cmd) and f.stem.rsplit("-", 1)[-1] in cmd


def _live(run_dir: Path) -> list[Path]:
    out = []
    for f in sorted(run_dir.glob("*.pid")):
        try:
            pid, start = _read_pid(f)
        except (ValueError, IndexError):
            continue
        if alive(pid) and _ours(f, pid, start):
            out.append(f)
    return out


def stop_dir(run_dir: Path, timeout: float = 30.0) -> list[str]:
    """Stop what ``run_dir`` records; returns one line per PID file."""
    lines, stopped_pids = [], set()
    for f in sorted(run_dir.glob("*.pid")):
        name = f.stem
        try:
            pid, start = _read_pid(f)
        except (ValueError, IndexError):
            lines.append(f"{name}: unreadable PID file; removed")
            f.unlink()
            continue
        if _cmdline(pid) is None or not alive(pid):
            lines.append(f"{name}: not running (pid {pid})")
            f.unlink()
            stopped_pids.add(pid)
            continue
        if not _ours(f, pid, start):
            lines.append(f"{name}: pid {pid} now belongs to another program; left alone")
            f.unlink()
            continue
        try:
            os.killpg(pid, signal.SIGTERM)
        except OSError:
            os.kill(pid, signal.SIGTERM)
        deadline = time.time() + timeout
        while time.time() < deadline and alive(pid):
            time.sleep(0.1)
        if alive(pid):
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
            lines.append(f"{name}: killed (pid {pid} did not stop within {timeout:g}s)")
        else:
            lines.append(f"{name}: stopped (pid {pid})")
        f.unlink()
        stopped_pids.add(pid)
    ep = run_dir / "endpoints.json"
    if ep.exists() and stopped_pids:
        try:
            entries = json.loads(ep.read_text())
            for e in entries:
                if e.get("pid") in stopped_pids:
                    e["status"] = "stopped"
            tmp = ep.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(entries, indent=2))
            os.replace(tmp, ep)
        except (OSError, ValueError):
            lines.append(f"{ep}: unreadable; left as it is")
    return lines


def main(argv=None) -> int:
    ap = make_parser("bash serving/stop.sh", __doc__, ["bash serving/stop.sh", "bash serving/stop.sh --serve-dir .serve-27b --timeout 60"])
    ap.add_argument("--serve-dir", dest="run_dir", default=os.environ.get("MMCF_SERVE_DIR", ".serve"),
                    help="the launcher's --serve-dir ($MMCF_SERVE_DIR or .serve)")
    ap.add_argument("--timeout", type=positive_float, default=30, help="seconds between SIGTERM and SIGKILL")
    a = ap.parse_args(argv)
    run_dir = Path(a.run_dir).resolve()
    if not list(run_dir.glob("*.pid")):
        print(f"stop.sh: no servers recorded in {run_dir}")
        others = []
        sf = state_file()
        if sf.exists():
            for d in dict.fromkeys(x for x in sf.read_text().splitlines() if x.strip()):
                if Path(d) != run_dir and Path(d).is_dir() and _live(Path(d)):
                    others.append(d)
        for d in others:
            print(f"  servers are running from {d}: bash serving/stop.sh --serve-dir {d}")
        return 0
    for line in stop_dir(run_dir, a.timeout):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
