"""Where a command's CPU goes: every process it starts, grouped by what it runs (Linux only).

    python scripts/cpu_census.py -- .venv/bin/python -m pytest -q -n 4      # the test suite (docs/performance.md)
    python scripts/cpu_census.py --by-test -- .venv/bin/python -m pytest -q -n 4   # which tests start what

Runs the command with a marker in its environment and samples ``/proc`` every 0.3 s; a process is the command's
when its environment carries the marker (servers started in their own session and reparented still do; a process
given a fresh environment does not and is left out, as are processes that live less than one sample). Prints the
CPU seconds (user + system) per kind of process: a ``python -m`` module, a pytest-xdist worker, a
multiprocessing child, SGLang's detokenizer, chromium, or the first words of the command line. ``--by-test``
groups by the test that started the process instead (pytest's ``PYTEST_CURRENT_TEST``, which a process started
during a test inherits; pytest's own processes, whose work happens in-process, are "(no test)").
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import time
import uuid

HZ = os.sysconf("SC_CLK_TCK")


def _test_of(environ: bytes) -> str:
    m = re.search(rb"(?:^|\0)PYTEST_CURRENT_TEST=([^\0]*)", environ)
    return m.group(1).decode(errors="replace").rsplit(" (", 1)[0] if m else "(no test)"


def _sample(marker: bytes, seen: dict) -> None:
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            key = (pid, fields[19])  # pid and start time: a reused pid is another process
            if key not in seen:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    environ = f.read()
                if marker not in environ:
                    seen[key] = None
                    continue
                seen[key] = ["", 0.0, _test_of(environ)]
            if seen[key] is None:
                continue
            seen[key][1] = (int(fields[11]) + int(fields[12])) / HZ
            if not seen[key][0]:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    seen[key][0] = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue  # gone, or not ours to read


def kind(cmd: str) -> str:
    if "exec(eval(sys.stdin" in cmd:
        return "pytest-xdist worker"
    if "sglang::" in cmd:
        return cmd.split()[0]
    m = re.search(r" -m (\S+)", cmd)
    if m:
        return f"python -m {m.group(1)}"
    if "multiprocessing" in cmd or "from multiprocess" in cmd:
        return "multiprocessing child"
    if "chrom" in cmd or "/proc/self/exe" in cmd:
        return "chromium"
    return " ".join(os.path.basename(w) for w in cmd.split()[:2])[:60] or "(unnamed)"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--top", type=int, default=25, help="kinds to list (default 25)")
    ap.add_argument("--by-test", action="store_true",
                    help="group by the test that started each process (pytest), not by kind of process")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = ap.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("give the command after --")
    token = uuid.uuid4().hex
    marker = f"MMCF_CPU_CENSUS={token}".encode()
    seen: dict = {}
    t0 = time.time()
    p = subprocess.Popen(cmd, env={**os.environ, "MMCF_CPU_CENSUS": token})
    while p.poll() is None:
        _sample(marker, seen)
        time.sleep(0.3)
    _sample(marker, seen)
    wall = time.time() - t0
    by: dict = collections.defaultdict(list)
    for v in seen.values():
        if v is not None:
            by[v[2] if args.by_test else kind(v[0])].append(v[1])
    total = sum(sum(v) for v in by.values())
    print(f"\n{len([v for v in seen.values() if v])} processes, {total:.0f} CPU-s in {wall:.0f} s "
          f"(exit status {p.returncode})", file=sys.stderr)
    for k, v in sorted(by.items(), key=lambda kv: -sum(kv[1]))[:args.top]:
        print(f"{sum(v):8.1f} CPU-s {len(v):5d} x  {k}", file=sys.stderr)
    return p.returncode


if __name__ == "__main__":
    sys.exit(main())
