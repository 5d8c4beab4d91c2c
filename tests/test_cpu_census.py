"""scripts/cpu_census.py: a command's CPU by kind of process (docs/performance.md, the test suite on two cores)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.conftest import REPO
from tests.guards import HANG_GUARD_S

CENSUS = [sys.executable, str(REPO / "scripts" / "cpu_census.py"), "--"]


def test_the_census_counts_the_command_and_the_processes_it_starts():
    busy = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"
    code = ("import subprocess, sys\n"
            "subprocess.run([sys.executable, '-m', 'timeit', '-n', '1', '-r', '1', 'sum(range(3 * 10**7))'])\n"
            + busy.format(s=1.0))
    r = subprocess.run([*CENSUS, sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert r.returncode == 0, r.stderr
    assert re.search(r"CPU-s\s+1 x  python -m timeit", r.stderr), r.stderr
    (own,) = re.findall(r"([\d.]+) CPU-s\s+1 x  python -c", r.stderr)
    assert float(own) >= 0.6, r.stderr  # its own second of CPU, less at most the last 0.3 s sample


def test_the_census_passes_the_commands_exit_status_on():
    r = subprocess.run([*CENSUS, sys.executable, "-c", "raise SystemExit(3)"], capture_output=True, text=True,
                       timeout=HANG_GUARD_S)
    assert r.returncode == 3 and "exit status 3" in r.stderr
    r = subprocess.run([*CENSUS[:-1]], capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert r.returncode == 2 and "give the command after --" in r.stderr


def test_the_census_groups_processes_by_the_test_that_started_them():
    code = ("import os, subprocess, sys\n"
            "env = dict(os.environ, PYTEST_CURRENT_TEST='tests/test_x.py::test_y (call)')\n"
            "subprocess.run([sys.executable, '-m', 'timeit', '-n', '1', '-r', '1', 'sum(range(3 * 10**7))'], env=env)\n")
    outside = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}  # as a command run outside pytest
    r = subprocess.run([*CENSUS[:-1], "--by-test", "--", sys.executable, "-c", code], capture_output=True, text=True,
                       env=outside, timeout=HANG_GUARD_S)
    assert r.returncode == 0, r.stderr
    assert re.search(r"CPU-s\s+1 x  tests/test_x.py::test_y$", r.stderr, re.M), r.stderr
    assert re.search(r"CPU-s\s+1 x  \(no test\)$", r.stderr, re.M), r.stderr
