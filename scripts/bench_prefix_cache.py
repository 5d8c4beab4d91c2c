"""The entropy probe's request order against a server's prefix cache, at paper shape, without a GPU.

    python scripts/bench_prefix_cache.py [--trajectories 2000] [--capacity-tokens 1000000] [--servers 2]

Two parts, one run:

1. **Paper-shaped streams** (ours, from the paper's Table 4: ReAct's working context 8.8K tokens on ~6 LLM
   calls; a system prompt shared by every request): per trajectory 2-9 image-bearing steps (the images stay
   in ReAct's context), the first prompt ~2.4K tokens (1.2K shared system prompt, the question and its
   image), each later one ~1.1K longer (the previous step's reply and observation). Every request is the
   regenerate probe's: the step's prompt without the query images. Each order and spread is replayed through
   a token-level LRU radix cache per server (probes/prefix_cache/) at ``--capacity-tokens`` per server
   and at 128 and 256 trajectories in flight per server.
2. **The real path**: a scripted ReAct run on the demo benchmark (``--demo-trials`` trials), its exact request
   token streams rendered with the embedded Qwen3.5's chat template (python -m probes.prefix_cache's code),
   at a cache that holds about two trajectories and 4 in flight per server. Six short trajectories: it shows
   the exact-stream path end to end, not the effect at scale (part 1 does; more trials of the deterministic
   scripted model would repeat the same prompts).

The target (issue 24): the probes' order (per trajectory, pinned) serves >= 90 % of what an unbounded cache
would; printed as "of ideal".
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def paper_streams(n: int, seed: int = 0) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    system = list(rng.integers(1000, 200_000, 1200))
    out = []
    for t in range(n):
        steps = int(np.clip(rng.normal(5.5, 2.0), 2, 9))
        prefix = system + list(rng.integers(1000, 200_000, int(rng.normal(1200, 200))))
        reqs = []
        for _ in range(steps):
            reqs.append(np.asarray(prefix, dtype=np.int64))
            prefix = prefix + list(rng.integers(1000, 200_000, max(200, int(rng.normal(1100, 300)))))
        out.append(reqs)
    return out


def table(streams, capacity: int, servers: int, concurrency: int) -> None:
    from probes.prefix_cache import report

    t = time.perf_counter()
    rows = report(streams, capacity=capacity, servers=servers, concurrency=concurrency)
    for r in rows:
        print(f"    {r['order']:32s} servers {r['servers']}: {100 * r['cached_share']:5.1f} % cached "
              f"({100 * r['of_ideal']:5.1f} % of ideal)")
    print(f"    ({time.perf_counter() - t:.1f} s)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trajectories", type=int, default=1000)
    ap.add_argument("--capacity-tokens", type=int, default=1_000_000,
                    help="per server (a TP=4 group's KV pool holds on the order of a million tokens; SGLang logs "
                         "max_total_num_tokens)")
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--demo-trials", type=int, default=1)
    a = ap.parse_args(argv)

    streams = paper_streams(a.trajectories)
    n_req = sum(len(s) for s in streams)
    tokens = sum(len(r) for s in streams for r in s)
    print(f"1. paper-shaped: {a.trajectories} trajectories, {n_req} requests, {tokens / 1e6:.1f} M prompt tokens, "
          f"{a.capacity_tokens:,} tokens of cache per server")
    for per_server in (128, 256):
        print(f"  {per_server} trajectories in flight per server ({per_server * a.servers} in all):")
        table(streams, a.capacity_tokens, a.servers, per_server)

    from agent.run import main as run_main
    from probes.prefix_cache import probe_streams

    with tempfile.TemporaryDirectory() as d:
        rd = Path(d) / "run"
        assert run_main(["--method", "react", "--backend", "scripted", "--benchmark", "demo", "--trials",
                         str(a.demo_trials), "--out", str(rd), "--no-progress"]) == 0
        demo = probe_streams(rd)
    per = np.mean([len(s[-1]) for s in demo])
    cap = int(2 * per)
    print(f"2. the real path: {len(demo)} demo trajectories (scripted run), "
          f"{sum(len(s) for s in demo)} requests rendered by the embedded Qwen3.5's chat template, "
          f"~{per:.0f} tokens in a trajectory's last prompt; cache {cap:,} tokens per server (~2 trajectories)")
    table(demo, cap, a.servers, 4)
    return 0


if __name__ == "__main__":
    sys.exit(main())
