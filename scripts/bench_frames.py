"""What reading a run costs in memory as runs grow, and how that grows when the run doubles.

    python scripts/bench_frames.py                                   # the analysis: 5,120 and 10,240 trajectories
    python scripts/bench_frames.py --sizes 200 400 --tokens 1000 --routes scan step_entropies tokens

Writes runs (scripts/bench_data.py: 10 calls a trajectory of ~``--tokens`` tokens each, top-20 alternatives) of
each size, then measures each route in a fresh process whose parent is this small one (peak resident memory from
``/proc/self/status`` VmHWM, so nothing of another process is counted):

- ``report``: ``analysis.report --react RUN`` (Figure 1 from every call's summary; what a user runs);
- ``steps``: ``frames.steps(RUN)``, the per-call frame every table of calls is built from;
- ``scan``: the mean think-token entropy per step by the docs/frames.md lazy scan over ``frames.token_files``;
- ``step_entropies``: the same by ``agent.rundir.frames.step_entropies`` (one trajectory's arrays at a time);
- ``tokens``: the same from ``frames.tokens(run, ["call", "think", "top_logprobs"])`` held in memory.

It prints a table (MB at peak, seconds) per size, then each route's growth (peak at the largest size over peak at
the smallest); docs/frames.md and docs/performance.md quote it.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

PEAK = ("import re; print('PEAK_MB', int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read())"
        ".group(1)) / 1024)")
ROUTES = {
    "report": "from analysis.report import main; import tempfile; r = main(['--react', RUN, '--out', "
              "tempfile.mkdtemp()])",
    "steps": "from agent.rundir import frames; r = frames.steps(RUN)",
    "scan": "from agent.rundir.frames import think_entropy_by_step as f; r = f(RUN)",
    "step_entropies": "from agent.rundir import load_run; from agent.rundir.frames import step_entropies; "
                      "r = step_entropies(load_run(RUN)).groupby('step').H.mean()",
    "tokens": "import numpy as np; from agent.rundir import frames; from analysis.estimators.entropy import grouped_tail_entropy; "
              "t = frames.tokens(RUN, ['call', 'think', 'top_logprobs'], max_mb=1e9); t = t[t.think]; "
              "k = max(map(len, t.top_logprobs)); m = np.full((len(t), k), np.nan, np.float32); "
              "[m.__setitem__((i, slice(0, len(x))), x) for i, x in enumerate(t.top_logprobs)]; "
              "t['H'] = grouped_tail_entropy(m); r = t.groupby('call').H.mean()",
}


def measure(run: Path, route: str) -> tuple[float, float]:
    code = f"RUN = {str(run)!r}\n{ROUTES[route]}\n{PEAK}"
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    dt = time.perf_counter() - t0
    peak = float(next(ln.split()[1] for ln in out.stdout.splitlines() if ln.startswith("PEAK_MB")))
    return peak, dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[5120, 10240])
    ap.add_argument("--tokens", type=int, default=100, help="tokens a call, on average (default 100)")
    ap.add_argument("--routes", nargs="+", choices=list(ROUTES), default=["report", "steps"])
    a = ap.parse_args()
    from bench_data import RowPool, write_run

    pool = RowPool(seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        print("| trajectories | tokens | route | peak MB | seconds |\n|---:|---:|---|---:|---:|")
        peaks: dict = {}
        for n in a.sizes:
            run = Path(tmp) / f"run{n}"
            info = write_run(run, n, pool, tokens=a.tokens, progress=False)
            for route in a.routes:
                peak, dt = measure(run, route)
                peaks.setdefault(route, []).append(peak)
                print(f"| {n} | {info['tokens']:,} | {route} | {peak:.0f} | {dt:.1f} |", flush=True)
            shutil.rmtree(run)
        if len(a.sizes) > 1:
            print(f"\ngrowth from {a.sizes[0]:,} to {a.sizes[-1]:,} trajectories "
                  f"({a.sizes[-1] / a.sizes[0]:.2g}x the work):")
            for route, p in peaks.items():
                print(f"  {route}: {p[0]:.0f} -> {p[-1]:.0f} MB, {p[-1] / p[0]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
