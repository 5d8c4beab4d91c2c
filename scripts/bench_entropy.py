"""Benchmark: computing every H(τ_t) of a paper-scale record vs just reading and summing the same arrays.

    python scripts/bench_entropy.py [--scale 1.0] [--keep DIR]

Writes a synthetic run directory the way ``agent.run`` does (5,087 trajectories x ~10 calls x ~1,000
think tokens at --scale 1, top-20 ids + float32 logprobs in zstd Parquet sidecars; ~5 GB), then, each
in a fresh process so the peak memory is its own:

1. baseline: read every sidecar and sum its top-20 logprob matrix and think mask;
2. probe: ``analysis.entropy.step_entropies(load_run(...))`` — every call's think-segment grouped
   entropy, the per-step table the figures use.

Prints both times, their ratio (target <= 2x) and each phase's peak RSS (target < 4 GB).
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PAPER_TRAJECTORIES = 5087


def generate(root: Path, n_traj: int, calls: int, tokens: int, seed: int = 0) -> int:
    """A run directory with ``n_traj`` lines; returns the number of tokens written."""
    import io

    import pyarrow.parquet as pq

    from agent.rundir import RunDir, _token_table, token_key

    rng = np.random.default_rng(seed)
    rd = RunDir(root)
    rd.write_header({"method": "react", "variant": "", "benchmark": "synthetic", "budgets": {"t_max": 20, "b_max": 5},
                     "sampling": {}, "schema_version": 1})
    total = 0
    base = np.log(np.sort(rng.dirichlet(np.full(64, 0.2), size=4096), axis=1)[:, ::-1][:, :20]).astype(np.float32)
    with open(rd.results, "w") as res:
        for i in range(n_traj):
            arrays, call_rows = {}, []
            for c in range(1, calls + 1):
                n = int(rng.integers(tokens // 2, tokens * 3 // 2))
                top = base[rng.integers(0, len(base), size=n)]
                think = np.ones(n, dtype=bool)
                think[-max(1, n // 20):] = False  # the answer after </think>
                arrays[c] = {"id": rng.integers(0, 248_000, size=n, dtype=np.int32), "logprob": top[:, 0].copy(),
                             "think": think, "top_ids": rng.integers(0, 248_000, size=(n, 20), dtype=np.int32),
                             "top_logprobs": top, "exact_entropy": np.full(n, np.nan, dtype=np.float32)}
                call_rows.append({"index": c, "state": "react", "n_images": 1 if c <= 3 else 0, "prompt_tokens": 1000 * c,
                                  "completion_tokens": n, "think_tokens": int(think.sum()), "n_tokens": n})
                total += n
            key = token_key(f"s{i}", 0)
            buf = io.BytesIO()
            pq.write_table(_token_table(arrays, 20), buf, compression="zstd",
                           use_byte_stream_split=["logprob", "top_logprobs.list.element", "exact_entropy"],
                           use_dictionary=False)
            (root / "tokens" / f"{key}.parquet").write_bytes(buf.getvalue())
            res.write(json.dumps({"sample_id": f"s{i}", "trial": 0, "method": "react", "benchmark": "synthetic",
                                  "paper_category": "x", "status": "ok", "calls": call_rows, "events": [],
                                  "tokens_file": f"tokens/{key}.parquet"}) + "\n")
            if (i + 1) % max(1, n_traj // 20) == 0:
                print(f"  generated {i + 1}/{n_traj} trajectories", file=sys.stderr, flush=True)
    return total


def phase(kind: str, root: str) -> None:
    """Run one measured phase in this (fresh) process and print a JSON result line."""
    import resource

    from agent.rundir import load_run, read_parquet

    t0 = time.perf_counter()
    if kind == "baseline":
        acc, n = 0.0, 0
        for f in sorted((Path(root) / "tokens").glob("*.parquet")):
            t = read_parquet(f)
            top = t.column("top_logprobs").combine_chunks().flatten().to_numpy(zero_copy_only=False)
            think = t.column("think").to_numpy(zero_copy_only=False)
            acc += float(np.nansum(top)) + float(think.sum())
            n += len(think)
        out = {"checksum": acc, "tokens": n}
    else:
        from analysis.entropy import step_entropies

        df = step_entropies(load_run(root))
        out = {"rows": len(df), "mean_H": float(df["H"].mean())}
    out["seconds"] = time.perf_counter() - t0
    out["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 / 1024
    print(json.dumps(out))


def main() -> int:
    from agent.cli import make_parser

    ap = make_parser("python scripts/bench_entropy.py", __doc__, [
        "python scripts/bench_entropy.py                 # paper scale (5,087 trajectories; ~5 GB of sidecars)",
        "python scripts/bench_entropy.py --scale 0.05    # a quick look"])
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the paper's 5,087 trajectories")
    ap.add_argument("--calls", type=int, default=10, help="LLM calls per trajectory")
    ap.add_argument("--tokens", type=int, default=1000, help="mean think tokens per call")
    ap.add_argument("--keep", help="write the synthetic run here and keep it (default: a temp dir, removed)")
    ap.add_argument("--phase", choices=("baseline", "probe"), help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.phase:
        phase(a.phase, a.root)
        return 0
    root = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="mmcf-bench-entropy-"))
    n_traj = max(1, round(PAPER_TRAJECTORIES * a.scale))
    try:
        t0 = time.perf_counter()
        n_tok = generate(root, n_traj, a.calls, a.tokens)
        size = sum(p.stat().st_size for p in (root / "tokens").iterdir())
        print(f"synthetic record: {n_traj} trajectories x {a.calls} calls, {n_tok:,} tokens, "
              f"{size / 1e9:.2f} GB of sidecars ({size / n_tok:.1f} B/token), written in {time.perf_counter() - t0:.0f}s")
        res = {}
        for kind in ("baseline", "probe", "baseline"):  # baseline twice: the first run also warms the page cache
            r = subprocess.run([sys.executable, __file__, "--phase", kind, "--root", str(root)], capture_output=True,
                               text=True, check=True)
            res.setdefault(kind, []).append(json.loads(r.stdout.strip().splitlines()[-1]))
        base = min(x["seconds"] for x in res["baseline"])
        probe = res["probe"][0]
        print(f"baseline (read + sum the same arrays): {base:.1f}s, peak RSS {max(x['peak_rss_gb'] for x in res['baseline']):.2f} GB")
        print(f"probe (every H(τ_t), step_entropies): {probe['seconds']:.1f}s, peak RSS {probe['peak_rss_gb']:.2f} GB, "
              f"{probe['rows']:,} (trajectory, step) rows")
        print(f"ratio probe/baseline = {probe['seconds'] / base:.2f}  (target <= 2)")
        print(f"peak memory {probe['peak_rss_gb']:.2f} GB  (target < 4 GB)")
    finally:
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
