"""The runner's image memory: RSS after reading and encoding N distinct realistic images, bounded vs unbounded.

    python scripts/bench_images.py [--n 2300] [--kb 320]

Each sample's images are read (``load_image``) and encoded as a data URI (what every request carries) by the
runner, once per call. Before issue 24 both caches kept every distinct image for the life of the process
(~1.6 MB of RSS per 322 KB JPEG, ~2.8 GB over the release's 1,727 samples). This writes N distinct noisy JPEGs
of about ``--kb`` KB (distinct content, like distinct samples), then, each in a fresh process, reads all of
them the way a run does (every image twice: two calls) with the default bound (512 MB) and with the cache
unbounded (the old behaviour), and prints the RSS growth of each and their ratio. Same bytes read in both.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
from agent.backends import images as M
paths = json.loads(open(sys.argv[2]).read())
if sys.argv[3] != "default":
    M.set_image_cache_mb(float(sys.argv[3]))
base = rss(); t = time.perf_counter(); n_bytes = 0
for rep in range(2):
    for p in paths:
        img = M.load_image(p)
        n_bytes += len(img.data) + len(img.data_uri())
print(json.dumps({"rss_growth": rss() - base, "s": time.perf_counter() - t, "bytes": n_bytes,
                  "cache": M.image_cache_stats()}))
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2300, help="distinct images (the release: 1,727 samples, ~1.3 images each)")
    ap.add_argument("--kb", type=int, default=320, help="approximate JPEG size in KB")
    a = ap.parse_args(argv)
    import numpy as np
    from PIL import Image

    with tempfile.TemporaryDirectory() as d:
        rng = np.random.default_rng(0)
        import io

        def jpeg_bytes(side):
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
            return buf.tell()

        side = 400
        for _ in range(3):  # calibrate the side to the requested file size
            side = max(16, int(side * (a.kb * 1024 / jpeg_bytes(side)) ** 0.5))
        paths = []
        for i in range(a.n):
            p = Path(d) / f"img{i}.jpg"
            Image.fromarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8)).save(p, quality=90)
            paths.append(str(p))
        size = sum(Path(p).stat().st_size for p in paths) / len(paths) / 1024
        (Path(d) / "paths.json").write_text(json.dumps(paths))
        res = {}
        for label, arg in (("bounded (default 512 MB)", "default"), ("unbounded (before)", "1e9")):
            out = subprocess.run([sys.executable, "-c", CHILD, str(REPO), str(Path(d) / "paths.json"), arg],
                                 capture_output=True, text=True, check=True)
            res[label] = json.loads(out.stdout)
    print(f"{a.n} distinct JPEGs of {size:.0f} KB on average, each read and encoded twice (two calls)")
    for label, r in res.items():
        print(f"  {label:26s} RSS +{r['rss_growth'] / 2**20:7.0f} MB  ({r['rss_growth'] / a.n / 2**20:.2f} MB per image), "
              f"{r['s']:.2f} s, cache {r['cache']['images']} entries / {r['cache']['uris']} URIs")
    b, u = (res[k]["rss_growth"] for k in res)
    print(f"ratio bounded / unbounded RSS growth: {b / u:.2f} (same {res['unbounded (before)']['bytes'] / 2**20:.0f} MB read "
          "and encoded in both)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
