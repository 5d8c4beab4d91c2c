"""The viewer at two scales: page sizes and the writer's peak memory as the run grows.

    python scripts/bench_viewer.py [--scales 100,1000] [--calls 10] [--tokens 300] [--heap]

Writes a paper-shaped run per scale (scripts/bench_data.py, through the toolkit's writer; a distinct photo-sized
query image per trajectory), then ``python -m agent.show RUN --html`` on it as one process, and reports the
index page's size, the largest trajectory page, all files together, and the writer's peak RSS (from the kernel).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# each run is written by a child process: a child's peak RSS (ru_maxrss) starts from its parent's at fork, so this
# process stays small and the viewer's figure is its own
WRITE = ("import sys; sys.path[:0] = ['.', 'scripts']; from pathlib import Path; from bench_data import RowPool, "
         "write_run; write_run(Path(sys.argv[1]), int(sys.argv[2]), RowPool(seed=0, n_rows=1 << 16), "
         "calls=int(sys.argv[3]), tokens=int(sys.argv[4]), progress=False, distinct_images=True)")


# --heap: the same command under tracemalloc, its peak of live Python objects written to stderr at exit (the RSS
# also holds what the allocators keep for reuse; ~3x slower)
HEAP = ("import runpy, sys, tracemalloc; tracemalloc.start(); sys.argv = ['agent.show', *sys.argv[1:]]\n"
        "try:\n    runpy.run_module('agent.show', run_name='__main__')\n"
        "finally:\n    print(f'HEAP {tracemalloc.get_traced_memory()[1]}', file=sys.stderr)")


def measure(run: Path, out: Path, heap: bool = False) -> dict:
    cmd = ["-c", HEAP] if heap else ["-m", "agent.show"]
    p = subprocess.Popen([sys.executable, *cmd, str(run), "--html", str(out), "--tokens", "all"],
                         cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    err = p.stderr.read().decode()
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"agent.show failed on {run}: {err[-2000:]}")
    heap_bytes = [int(x.split()[1]) for x in err.splitlines() if x.startswith("HEAP ")]
    files = list((out.parent / f"{out.stem}_files").iterdir())
    pages = [f.stat().st_size for f in files if f.suffix == ".html"]
    return {"index": out.stat().st_size, "largest": max(pages), "total": out.stat().st_size + sum(f.stat().st_size
                                                                                                  for f in files),
            "rss": ru.ru_maxrss / 1024, "heap": heap_bytes[-1] / 1e6 if heap_bytes else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scales", default="100,1000")
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--heap", action="store_true", help="also measure the peak of live Python objects (tracemalloc)")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(x) for x in a.scales.split(",")):
            run = Path(tmp) / f"run{n}"
            subprocess.run([sys.executable, "-c", WRITE, str(run), str(n), str(a.calls), str(a.tokens)], cwd=REPO,
                           check=True)
            m = measure(run, Path(tmp) / f"view{n}" / "run.html")
            if a.heap:
                m["heap"] = measure(run, Path(tmp) / f"heap{n}" / "run.html", heap=True)["heap"]
            rows.append((n, m))
    print(f"| trajectories ({a.calls} calls of ~{a.tokens} tokens) | index page | largest trajectory page | "
          "all files | writer's peak RSS |" + (" peak of live Python objects |" if a.heap else ""))
    print("|---|---|---|---|---|" + ("---|" if a.heap else ""))
    for n, m in rows:
        print(f"| {n:,} | {m['index'] / 1e3:.1f} KB | {m['largest'] / 1e3:.1f} KB | {m['total'] / 1e6:.1f} MB | "
              f"{m['rss']:.0f} MB |" + (f" {m['heap']:.1f} MB |" if a.heap else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
