"""``python -m agent.benchmarks``: check a data directory, print its statistics, draw selections."""
from __future__ import annotations

import json
import logging
import os
from collections import Counter
from pathlib import Path

from ..cli import HelpFormatter, Parser

log = logging.getLogger(__name__)


def main(argv=None) -> int:
    ap = Parser(prog="python -m agent.benchmarks", description="benchmark manifests: stats and subsets",
                formatter_class=HelpFormatter, epilog="examples:\n"
                "  python -m agent.benchmarks stats DATA --json\n"
                "  python -m agent.benchmarks subset DATA/browsecomp_vl --seed 0 --out bcvl.jsonl")
    sub = ap.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("stats", help="per-benchmark counts, image histogram, category and data problems",
                        formatter_class=HelpFormatter, epilog="example: python -m agent.benchmarks stats DATA --strict")
    st.add_argument("dataset_dir", help="DATASET_DIR/<benchmark>/data_unified.jsonl + imgs/")
    st.add_argument("--json", action="store_true", help="print the report as JSON")
    st.add_argument("--strict", action="store_true", help="exit 1 if any problem was found")
    st.add_argument("--no-image-check", action="store_true", help="do not look for the image files")
    st.add_argument("--max-image-mb", type=float, help="image size limit (default 20; MMCF_MAX_IMAGE_MB)")
    ss = sub.add_parser("subset", help="the paper's subset of one benchmark (deterministic for a seed), or the "
                        "B_max sweep's random draw per benchmark", formatter_class=HelpFormatter,
                        epilog="examples:\n  python -m agent.benchmarks subset DATA/world_vqa --seed 0 --out wvqa.jsonl\n"
                        "  python -m agent.benchmarks subset DATA --random-per-benchmark 100 --seed 0 --out sweep.json\n"
                        "  python -m agent.run --benchmark DATA/mmsearch --selection sweep.json --b-max 3 ...")
    ss.add_argument("benchmark_dir", help="one benchmark directory (with --random-per-benchmark: the DATASET_DIR)")
    ss.add_argument("--seed", type=int, default=0, help="the subset's seed")
    ss.add_argument("--n", type=int, help="subset size (default: the paper's)")
    ss.add_argument("--random-per-benchmark", type=int, metavar="N",
                    help="D.2's selection: N samples at random from each benchmark of DATASET_DIR (paper: 100 x 7 = "
                         "700), written as a selection file for agent.run --selection")
    ss.add_argument("--out", help="write the subset's rows (or the selection file) here (default: print ids)")
    a = ap.parse_args(argv)
    if getattr(a, "max_image_mb", None):
        os.environ["MMCF_MAX_IMAGE_MB"] = str(a.max_image_mb)
    try:
        return _stats(a) if a.cmd == "stats" else _subset(a)
    except (FileNotFoundError, ValueError) as e:
        log.error(f"error: {e}")
        return 2


def _subset(a) -> int:
    # the manifests' modules load once the arguments parse (--help needs the standard library only)
    from .manifest import load_benchmark, load_dataset_dir  # noqa: PLC0415
    from .subsets import paper_subset, random_per_benchmark  # noqa: PLC0415

    if a.random_per_benchmark is not None:
        if a.random_per_benchmark < 1:
            raise ValueError("--random-per-benchmark needs N >= 1")
        sel = random_per_benchmark(load_dataset_dir(a.benchmark_dir, check_images=False), a.random_per_benchmark,
                                   a.seed)
        short = {k: len(v) for k, v in sel["benchmarks"].items() if len(v) < a.random_per_benchmark}
        text = json.dumps(sel, indent=1)
        if a.out:
            Path(a.out).write_text(text + "\n")
            print(f"{sel['total']} samples from {len(sel['benchmarks'])} benchmarks written to {a.out}"
                  + (f"; fewer than {a.random_per_benchmark} usable in {short}" if short else ""))
            print(f"next: python -m agent.run --benchmark {a.benchmark_dir}/<benchmark> --selection {a.out} ...")
        else:
            print(text)
        return 0
    m = load_benchmark(a.benchmark_dir, check_images=False)
    rows = paper_subset(m, a.seed, a.n)
    if a.out:
        lines = {s.line for s in rows}
        with open(m.path) as src, open(a.out, "w") as dst:
            for n, line in enumerate(src, 1):
                if n in lines:
                    dst.write(line if line.endswith("\n") else line + "\n")
        print(f"{len(rows)} rows written to {a.out}")
    else:
        print("\n".join(s.id for s in rows))
    return 0


def _stats(a) -> int:
    """Per-benchmark counts and data problems; 1 when a benchmark is incomplete (or, with --strict, has problems)."""
    from .manifest import load_dataset_dir  # noqa: PLC0415
    from .subsets import incomplete_subset  # noqa: PLC0415

    ms = load_dataset_dir(a.dataset_dir, check_images=not a.no_image_check)
    rep = {"benchmarks": {k: m.stats() for k, m in ms.items()}, "total": sum(len(m.samples) for m in ms.values())}
    partial = {k: why for k, m in ms.items() if (why := incomplete_subset(m))}
    for k, why in partial.items():
        rep["benchmarks"][k]["incomplete"] = why
    if a.json:
        print(json.dumps(rep, ensure_ascii=False, indent=1))
    else:
        for k, m in ms.items():
            st_ = m.stats()
            print(f"{k:15s} {st_['samples']:5d} samples  [{st_['category']}]  images/sample {st_['images_per_sample']}  problems {len(m.problems)}")
            kinds = Counter(p.kind for p in m.problems)
            for p in m.problems[:5]:
                print(f"    {m.path}:{p.line}  {p.kind}  {p.id}  {p.detail}")
            if len(m.problems) > 5:
                print(f"    … {len(m.problems) - 5} more ({dict(kinds)}); --json lists all")
            if k in partial:
                print(f"    INCOMPLETE: {partial[k]}")
        print(f"total {rep['total']} samples")
    if partial:  # a run on it is refused; say so here too
        log.error(f"error: {len(partial)} benchmark(s) incomplete: {', '.join(partial)}")
        return 1
    if a.strict and any(m.problems for m in ms.values()):
        log.info("strict: data problems found")
        return 1
    return 0
