"""The HTML viewer at run scale: the writer's peak memory, the pages' sizes, and a browser's time to a usable page.

    python scripts/bench_viewer.py [--scales 400,1600] [--page-size 200]

What a user runs after a paper-scale run: ``python -m agent.show RUN --html run.html``. The run is paper-shaped
(scripts/bench_data.py: 10 calls of ~1,000 tokens per trajectory, a ~4 KB observation per step, and one
distinct ~330 KB, 1024 x 768 JPEG query image per trajectory, as every benchmark sample has its own). For each
scale the viewer runs as one process, in turn paged (the default ``--page-size``) and as one page
(``--page-size`` = the scale: what it wrote before paging), and this prints the peak RSS (from the kernel), the
total and the largest page size, and, where Chromium is installed, the time until the first page's script has
rendered the list (the page's own ``data-ready-ms``). Same lines read and the same bytes embedded per
trajectory in both. At 5,087 trajectories (the paper's ReAct runs over three backbones) the paged writer's
peak stays that of one page; the one-page writer's grows with the run.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

CHILD = r"""
import resource, sys, json
sys.path.insert(0, sys.argv[1])
from agent.show import build_html
info = build_html(sys.argv[2], sys.argv[3], page_size=int(sys.argv[4]))
print(json.dumps({"peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "bytes": info["bytes"],
                  "largest": info["largest_page_bytes"], "pages": len(info["pages"])}))
"""


#: How long the browser may take to render a page before the bench reports "did not open".
BROWSER_TIMEOUT_S = 600


def _ready_ms(page: Path, profile: Path) -> float | None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        return None
    try:
        r = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                            "--no-first-run", f"--user-data-dir={profile}", "--dump-dom", page.resolve().as_uri()],
                           capture_output=True, text=True, timeout=BROWSER_TIMEOUT_S)
    except subprocess.TimeoutExpired:  # the page did not render within the bound: said, not a crash
        return float("inf")
    m = re.search(r'data-ready-ms="(\d+)"', r.stdout)
    return float(m.group(1)) if m else None


def _ready(ms) -> str:
    if ms is None:
        return "n/a"
    return f"> {BROWSER_TIMEOUT_S} (did not open)" if ms == float("inf") else f"{ms / 1000:.1f}"


def main(argv=None) -> int:
    import json

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scales", default="400,1600", help="trajectories per scale")
    ap.add_argument("--page-size", type=int, default=None, help="the paged writer's page size (default: agent.show's)")
    a = ap.parse_args(argv)
    from bench_data import RowPool, write_run

    from agent.show import PAGE_SIZE

    page_size = a.page_size or PAGE_SIZE
    pool = RowPool(seed=0, n_rows=1 << 16)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for n in (int(x) for x in a.scales.split(",")):
            root = Path(d) / f"run{n}"
            t = time.perf_counter()
            write_run(root, n, pool, progress=False, distinct_images=True)
            print(f"wrote a {n}-trajectory run in {time.perf_counter() - t:.0f} s", file=sys.stderr)
            for label, size in (("paged", page_size), ("one page", n)):
                out = Path(d) / f"html{n}-{size}" / "run.html"
                t = time.perf_counter()
                r = subprocess.run([sys.executable, "-c", CHILD, str(REPO), str(root), str(out), str(size)],
                                   capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
                if r.returncode:
                    raise SystemExit(f"agent.show failed: {r.stderr[-2000:]}")
                wall = time.perf_counter() - t
                info = json.loads(r.stdout.strip().splitlines()[-1])
                ready = _ready_ms(out, Path(d) / "profile")
                rows.append((n, label, info["pages"], info["peak_mb"], info["bytes"] / 1e6, info["largest"] / 1e6,
                             wall, ready))
                print(f"measured: {n} trajectories, {label}: {rows[-1][2:]}", file=sys.stderr, flush=True)
                shutil.rmtree(out.parent)
            shutil.rmtree(root)
    print(f"python -m agent.show RUN --html run.html (page size {page_size}); paper-shaped lines, a distinct "
          "~330 KB JPEG per trajectory")
    print(f"{'trajectories':>12} {'writer':>9} {'pages':>5} {'peak RSS MB':>11} {'total MB':>9} {'largest MB':>10} "
          f"{'write s':>7} {'first page ready s':>18}")
    for n, label, pages, peak, tot, big, wall, ready in rows:
        print(f"{n:>12} {label:>9} {pages:>5} {peak:>11.0f} {tot:>9.1f} {big:>10.1f} {wall:>7.1f} "
              f"{_ready(ready):>18}")
    print("(the paged writer holds one page at a time; 'one page' is --page-size equal to the run: the old writer)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
