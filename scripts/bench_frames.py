"""What reading a run's tokens costs in memory as runs grow: an aggregate streamed vs the tokens held.

    python scripts/bench_frames.py [--sizes 200 400]

Writes paper-shaped runs (scripts/bench_data.py: 10 calls of ~1,000 tokens a trajectory, top-20 alternatives) of
each size, then measures, each in a fresh process whose parent is this small one (peak resident memory from
``/proc/self/status`` VmHWM, so nothing of another process is counted), the mean think-token entropy per step by
three routes:

- ``duckdb``: the docs/frames.md recipe, a lazy scan over ``frames.token_files(run)`` (bounded memory);
- ``step_entropies``: ``analysis.frames.step_entropies`` (one trajectory's arrays at a time);
- ``tokens``: ``frames.tokens(run, ["call", "think", "top_logprobs"])`` held in memory, then grouped.

It prints a table (MB at peak, seconds) per size; docs/frames.md quotes it.
"""
from __future__ import annotations

import argparse
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
    "scan": "from analysis.frames import think_entropy_by_step as f; r = f(RUN)",
    "step_entropies": "from agent.rundir import load_run; from analysis.frames import step_entropies; "
                      "r = step_entropies(load_run(RUN)).groupby('step').H.mean()",
    "tokens": "import numpy as np; from analysis import frames; from analysis.entropy import grouped_tail_entropy; "
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
    ap.add_argument("--sizes", type=int, nargs="+", default=[200, 400])
    a = ap.parse_args()
    from bench_data import RowPool, write_run

    pool = RowPool(seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        print("| trajectories | tokens | route | peak MB | seconds |\n|---:|---:|---|---:|---:|")
        for n in a.sizes:
            run = Path(tmp) / f"run{n}"
            info = write_run(run, n, pool, progress=False)
            for route in ROUTES:
                peak, dt = measure(run, route)
                print(f"| {n} | {info['tokens']:,} | {route} | {peak:.0f} | {dt:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
