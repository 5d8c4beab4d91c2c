"""What plain Parquet sidecars cost against the private encoding they replace: size on disk and read time.

    python scripts/bench_sidecar.py --against REV [--trajectories 20]

Writes one paper-shaped run (scripts/bench_data.py: 10 calls of ~1,000 tokens a trajectory, top-20 alternatives)
with commit REV's writer (a commit before format 3, so its sidecars are format 2), copies it and rewrites the
copy with ``python -m agent.rundir upgrade`` (format 3). Then, over the same tokens: bytes a generated token,
and the time to read every sidecar's every column into arrays with the toolkit's decoder (format 2 and 3), and
with pyarrow alone (format 3: what any other tool pays). Best of three reads each, on this machine.
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

from bench_probe import tree_at  # noqa: E402

from agent.rundir.sidecar import decode, read_parquet, sidecar_format  # noqa: E402
from agent.rundir.upgrade import upgrade_run  # noqa: E402

WRITE = ("import sys; sys.path.insert(0, 'scripts'); from pathlib import Path; from bench_data import RowPool, "
         "write_run; write_run(Path(sys.argv[1]), int(sys.argv[2]), RowPool(seed=0), progress=False)")


def best_of(fn, n: int = 3) -> float:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return min(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", required=True, help="a commit whose writer writes format-2 sidecars")
    ap.add_argument("--trajectories", type=int, default=20)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        old_tree = tree_at(a.against, tmp / "tree")
        old = tmp / "format2"
        subprocess.run([sys.executable, "-c", WRITE, str(old), str(a.trajectories)], cwd=old_tree, check=True)
        files2 = sorted((old / "tokens").glob("*.parquet"))
        if not files2 or sidecar_format(files2[0]) != 2:
            raise SystemExit(f"--against {a.against}: its writer did not write format-2 sidecars")
        new = tmp / "format3"
        shutil.copytree(old, new)
        upgrade_run(new)
        files3 = sorted((new / "tokens").glob("*.parquet"))
        n_tok = sum(len(decode(p, ["call"])["call"]) for p in files3)
        rows = []
        for name, files in (("format 2 (private encoding)", files2), ("format 3 (plain Parquet)", files3)):
            size = sum(p.stat().st_size for p in files)
            rows.append((name, size, best_of(lambda fs=files: [decode(p) for p in fs])))
        plain = best_of(lambda: [read_parquet(p).to_pandas() for p in files3])
    (n2, s2, t2), (n3, s3, t3) = rows
    print(f"{a.trajectories} trajectories, {len(files3)} sidecars, {n_tok:,} generated tokens with top-20 alternatives")
    print("| sidecar | bytes a token | read every column (toolkit's decoder) |")
    print("|---|---|---|")
    for name, size, t in rows:
        print(f"| {name} | {size / n_tok:.1f} B | {1e9 * t / n_tok:.0f} ns a token |")
    print(f"| format 3 / format 2 | {s3 / s2:.3f} | {t3 / t2:.3f} |")
    print(f"format 3 read by pyarrow alone into pandas: {1e9 * plain / n_tok:.0f} ns a token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
