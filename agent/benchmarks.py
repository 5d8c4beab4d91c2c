"""Benchmark manifests in the release's unified format: loading, data checks, the paper's subsets.

    python -m agent.benchmarks stats DATASET_DIR [--json] [--strict]
    python -m agent.benchmarks subset DATASET_DIR/browsecomp_vl --seed 0 --out subset.jsonl

Layout: ``DATASET_DIR/<benchmark>/data_unified.jsonl`` with images in ``DATASET_DIR/<benchmark>/imgs/``.
A row has ``id, query, query_images, answer`` and optionally ``options, gt_option, source, category,
difficulty, level, subtask, language``; options are appended to the question text. Real manifests
have flaws (duplicate ids, empty answers, categories that are JSON-list strings, missing image files,
torn lines): each is reported with file and line, the valid rows are kept, a duplicate id counts once
(its first occurrence), and ``--strict`` turns any problem into a failure.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .backends.images import ImageError, load_image, max_image_bytes
from .cli import HelpFormatter
from .tools.demo_world import ensure_demo_world

__all__ = ["Sample", "Problem", "Manifest", "load_benchmark", "load_dataset_dir", "PAPER_CATEGORY", "paper_subset",
           "random_per_benchmark", "load_selection",
           "resolve_benchmark"]

#: Paper §4.1: the three benchmark categories (plus the HLE-VL extra and the offline demo).
PAPER_CATEGORY = {
    "simplevqa": "Atomic factuality", "world_vqa": "Atomic factuality",
    "mmsearch": "Dynamic information-seeking", "livevqa": "Dynamic information-seeking",
    "browsecomp_vl": "Visual deep research", "mmsearch_plus": "Visual deep research", "vdr_bench": "Visual deep research",
    "hle_vl": "HLE-VL (extra)", "demo": "Demo (offline world)",
}


_PAPER_CATEGORIES = ("Atomic factuality", "Dynamic information-seeking", "Visual deep research")


@dataclass
class Sample:
    id: str
    query: str
    query_images: list[str]
    answer: str
    benchmark: str
    line: int
    image_dir: str = ""
    options: list[str] | None = None
    gt_option: str | None = None
    category: str | None = None          # the benchmark's own topical category, normalised
    paper_category: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def question(self) -> str:
        """The text the agent sees: the query, with the options appended when there are any."""
        if self.options:
            return self.query.rstrip() + "\n\nOptions:\n" + "\n".join(str(o) for o in self.options)
        return self.query

    @property
    def image_paths(self) -> list[Path]:
        return [Path(self.image_dir) / f for f in self.query_images]

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Problem:
    line: int
    id: str
    kind: str
    detail: str


@dataclass
class Manifest:
    name: str
    path: Path
    samples: list[Sample]
    problems: list[Problem]

    @property
    def category(self) -> str:
        return PAPER_CATEGORY.get(self.name, "Uncategorised")

    def stats(self) -> dict:
        hist = Counter(str(len(s.query_images)) for s in self.samples)
        return {"samples": len(self.samples), "category": self.category,
                "images_per_sample": dict(sorted(hist.items(), key=lambda kv: int(kv[0]))),
                "problems": [asdict(p) for p in self.problems]}


def _norm_category(raw, line: int, sid: str, problems: list[Problem]):
    if isinstance(raw, list):
        return " / ".join(map(str, raw)) or None
    if isinstance(raw, str) and raw.strip().startswith("["):
        try:
            val = json.loads(raw)
        except json.JSONDecodeError:
            return raw
        problems.append(Problem(line, sid, "category_json_list", f"category is a JSON-list string: {raw[:80]}"))
        return " / ".join(map(str, val)) if isinstance(val, list) else raw
    return raw


def _inside_imgs(im) -> bool:
    """Whether a manifest's image path stays inside the benchmark's imgs/ (relative, no '..')."""
    if not isinstance(im, str) or not im or im.startswith(("/", "\\")) or ":" in im.split("/")[0]:
        return False
    return ".." not in Path(im).parts


def _resolves_inside(path: Path, root: Path) -> bool:
    """Whether ``path``'s real path (symbolic links followed) lies inside ``root`` (imgs/, itself resolved: an
    imgs/ that is a link to a shared image store is fine; a link inside it that leaves it is not)."""
    try:
        real = path.resolve()
    except (OSError, RuntimeError):  # a link loop
        return False
    return real == root or root in real.parents


def _image_problem(path: Path) -> tuple[str, str] | None:
    """(kind, detail) when the image cannot be used: missing, not a file, too large, not an image."""

    if not path.exists():
        return "missing_image", f"{path} not found"
    try:
        if path.is_file() and path.stat().st_size > max_image_bytes():
            return "image_too_large", f"{path}: {path.stat().st_size / 2**20:.1f} MB > {max_image_bytes() / 2**20:g} MB"
        load_image(path)
    except ImageError as e:
        return "not_an_image", str(e)
    return None


def _from_hle(row: dict) -> dict:
    """WebWatcher's HLE-VL rows use question/image(s) rather than query/query_images."""
    row = dict(row)
    if "query" not in row and "question" in row:
        row["query"] = row.pop("question")
    if "query_images" not in row:
        imgs = row.pop("images", None) or row.pop("image", None) or row.pop("image_path", None)
        row["query_images"] = imgs if isinstance(imgs, list) else ([imgs] if imgs else [])
    return row


def load_benchmark(path: str | Path, name: str | None = None, *, check_images: bool = True) -> Manifest:
    """Load ``<dir>/data_unified.jsonl`` (or a .jsonl file); never raises on bad rows, reports them."""
    p = Path(path)
    f = p / "data_unified.jsonl" if p.is_dir() else p
    if not f.exists():
        raise FileNotFoundError(f"{f}: benchmark manifest not found")
    bench = name or (f.parent.name if f.name == "data_unified.jsonl" else f.stem)
    img_dir = f.parent / "imgs"
    problems: list[Problem] = []
    samples: list[Sample] = []
    seen: set[str] = set()
    if check_images and not img_dir.is_dir():
        problems.append(Problem(0, "", "missing_image_dir", f"{img_dir} does not exist: no query image can be loaded"))
    with open(f, "rb") as fh:
        for n, raw in enumerate(fh, 1):
            if n == 1 and raw.startswith(b"\xef\xbb\xbf"):  # a UTF-8 BOM: accepted (some editors write one)
                raw = raw[3:]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                problems.append(Problem(n, "", "non_utf8", f"{f.name}:{n}: bytes that are not UTF-8 at offset {e.start} "
                                                          f"({raw[max(0, e.start - 10):e.start + 10]!r}); row skipped"))
                continue
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if not isinstance(row, dict):
                    raise ValueError("not a JSON object")
            except ValueError as e:
                problems.append(Problem(n, "", "torn_line", f"{f.name}:{n}: not valid JSON ({e}): {line[:60]!r}"))
                continue
            if bench == "hle_vl":
                row = _from_hle(row)
            sid = str(row.get("id", "")).strip()
            if not sid:
                problems.append(Problem(n, "", "missing_id", "row has no id"))
                continue
            if sid in seen:
                problems.append(Problem(n, sid, "duplicate_id", f"id {sid!r} already seen earlier; this row is skipped"))
                continue
            seen.add(sid)
            query = row.get("query")
            imgs = row.get("query_images")
            if not isinstance(query, str) or not query.strip():
                problems.append(Problem(n, sid, "missing_query", "no query text; row skipped"))
                continue
            if isinstance(imgs, str):
                imgs = [imgs]
            if not isinstance(imgs, list) or not imgs:
                problems.append(Problem(n, sid, "no_query_images", "query_images missing or empty; row skipped"))
                continue
            outside = [im for im in imgs if not _inside_imgs(im)]
            if outside:  # never read: a manifest must not point the toolkit at arbitrary files
                problems.append(Problem(n, sid, "path_outside_imgs", f"image path(s) {outside[:3]} leave {img_dir} "
                                                                     "(absolute or '..'); row refused"))
                continue
            if img_dir.is_dir():  # symlinks: the real path must stay inside imgs/ (ln -s /elsewhere imgs/r escapes it)
                root = img_dir.resolve()
                escaped = [im for im in imgs if not _resolves_inside(img_dir / im, root)]
                if escaped:
                    problems.append(Problem(n, sid, "path_outside_imgs", f"image path(s) {escaped[:3]} resolve outside "
                                                                         f"{img_dir} (a symbolic link); row refused"))
                    continue
            answer = row.get("answer")
            if answer is None or not str(answer).strip():
                problems.append(Problem(n, sid, "empty_answer", "gold answer is empty (kept; it cannot be graded correct)"))
            if check_images and img_dir.is_dir():
                for im in imgs:
                    problem = _image_problem(img_dir / im)
                    if problem:
                        problems.append(Problem(n, sid, problem[0], problem[1]))
            cat = _norm_category(row.get("category"), n, sid, problems)
            known = {"id", "query", "query_images", "answer", "options", "gt_option", "category", "source"}
            samples.append(Sample(
                id=sid, query=query, query_images=[str(i) for i in imgs], answer="" if answer is None else str(answer),
                benchmark=bench, line=n, image_dir=str(img_dir), options=row.get("options") or None,
                gt_option=row.get("gt_option"), category=cat,
                # the demo benchmark spans the paper's three categories, one row each way (its rows say which)
                paper_category=(cat if bench == "demo" and cat in _PAPER_CATEGORIES else
                                PAPER_CATEGORY.get(bench, "Uncategorised")),
                extra={k: v for k, v in row.items() if k not in known}))
    return Manifest(bench, f, samples, problems)


def load_dataset_dir(root: str | Path, *, check_images: bool = True) -> dict[str, Manifest]:
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: dataset directory not found")
    out = {d.name: load_benchmark(d, check_images=check_images)
           for d in sorted(root.iterdir()) if (d / "data_unified.jsonl").exists()}
    if not out:
        raise FileNotFoundError(f"{root}: no <benchmark>/data_unified.jsonl found")
    return out


def resolve_benchmark(name_or_path: str) -> Manifest:
    """``demo`` = the offline demo benchmark; else a benchmark directory or .jsonl path."""
    if name_or_path == "demo":
        return load_benchmark(ensure_demo_world() / "demo", "demo")
    return load_benchmark(name_or_path)


# ------------------------------------------------------------------ the paper's subset policy (A.2)
def _largest_remainder(sizes: dict, n: int) -> dict:
    total = sum(sizes.values())
    quotas = {k: n * v / total for k, v in sizes.items()}
    alloc = {k: min(int(q), sizes[k]) for k, q in quotas.items()}
    rest = n - sum(alloc.values())
    for k in sorted(quotas, key=lambda k: (-(quotas[k] - int(quotas[k])), str(k))):
        if rest <= 0:
            break
        if alloc[k] < sizes[k]:
            alloc[k] += 1
            rest -= 1
    return alloc


def stratified(samples: list[Sample], key, n: int, seed: int) -> list[Sample]:
    groups: dict = defaultdict(list)
    for s in samples:
        groups[key(s)].append(s)
    alloc = _largest_remainder({k: len(v) for k, v in groups.items()}, min(n, len(samples)))
    rng = random.Random(seed)
    chosen = []
    for k in sorted(groups, key=str):
        chosen.extend(rng.sample(groups[k], alloc[k]))
    order = {s.id: i for i, s in enumerate(samples)}
    return sorted(chosen, key=lambda s: order[s.id])


def paper_subset(m: Manifest, seed: int = 0, n: int | None = None) -> list[Sample]:
    """BrowseComp-VL: all level-2 + 100 seeded level-1; WorldVQA: proportional over its (non-People)
    categories; VDR-Bench: proportional over the tier prefix of the ids (base, hard, hard1) and topic."""
    s = m.samples
    if m.name == "browsecomp_vl":
        lvl = lambda x: str(x.extra.get("level") or x.id.split("_")[1])  # noqa: E731
        l2 = [x for x in s if lvl(x).endswith("2")]
        l1 = [x for x in s if lvl(x).endswith("1")]
        pick = set(x.id for x in random.Random(seed).sample(l1, min(n or 100, len(l1))))
        return [x for x in s if x in l2 or x.id in pick]
    if m.name == "world_vqa":
        pool = [x for x in s if (x.category or "") != "People"]
        return stratified(pool, lambda x: x.category, n or 200, seed)
    if m.name == "vdr_bench":
        def tier(x):
            parts = x.id.split("_")
            return (parts[0], parts[1] if len(parts) > 1 else "")
        return stratified(s, tier, n or 200, seed)
    raise ValueError(f"the paper uses {m.name} as released; no subset policy (browsecomp_vl, world_vqa, vdr_bench)")


def random_per_benchmark(manifests: dict[str, Manifest], n: int, seed: int) -> dict:
    """D.2 (Table 14): "100 examples at random from each of the seven benchmarks (700 samples)". A selection:
    ``{"kind", "n_per_benchmark", "seed", "benchmarks": {name: [ids in manifest order]}}``; deterministic for a
    seed (each benchmark draws from its own ``Random(f"{seed}:{name}")``, so adding a benchmark changes no other's
    draw; ours, the paper does not say how it drew). A benchmark with fewer than ``n`` usable samples gives all."""
    out = {}
    for name, m in sorted(manifests.items()):
        rng = random.Random(f"{seed}:{name}")
        pick = {s.id for s in rng.sample(m.samples, min(n, len(m.samples)))}
        out[name] = [s.id for s in m.samples if s.id in pick]
    return {"kind": "random-per-benchmark", "n_per_benchmark": n, "seed": seed, "benchmarks": out,
            "total": sum(len(v) for v in out.values())}


def load_selection(path: str | Path, benchmark: str) -> tuple[list[str], dict]:
    """The sample ids a selection file (``subset --random-per-benchmark``) holds for ``benchmark``, and what to
    record of it in a run header."""

    p = Path(path)
    try:
        raw = p.read_bytes()
        sel = json.loads(raw)
        ids = sel["benchmarks"][benchmark]
    except FileNotFoundError:
        raise FileNotFoundError(f"{p}: selection file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{p}: not a selection file ({e})") from None
    except (KeyError, TypeError):
        names = sorted((sel.get("benchmarks") or {}) if isinstance(sel, dict) else [])
        raise ValueError(f"{p}: no selection for benchmark {benchmark!r} (it has: {', '.join(names) or 'none'})") from None
    return list(ids), {"file": str(p), "sha256": hashlib.sha256(raw).hexdigest(), "kind": sel.get("kind"),
                       "seed": sel.get("seed"), "n_per_benchmark": sel.get("n_per_benchmark")}


# ------------------------------------------------------------------ CLI
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m agent.benchmarks", description="benchmark manifests: stats and subsets",
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
        if a.cmd == "stats":
            ms = load_dataset_dir(a.dataset_dir, check_images=not a.no_image_check)
            rep = {"benchmarks": {k: m.stats() for k, m in ms.items()}, "total": sum(len(m.samples) for m in ms.values())}
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
                print(f"total {rep['total']} samples")
            if a.strict and any(m.problems for m in ms.values()):
                print("strict: data problems found", file=sys.stderr)
                return 1
            return 0
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
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
