"""Which samples run: the paper's stratified subsets (appendix D.2), random draws per benchmark, and selection files."""
from __future__ import annotations

import hashlib
import json
import random
from collections import defaultdict
from pathlib import Path

from .manifest import Manifest, Sample


# the paper's subset policy (A.2)
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


#: Paper D.1: HLE-VL is WebWatcher's "released 330 question visual subset".
HLE_VL_VISUAL = 330
#: Problems that leave a row without a usable image inside the benchmark directory (or drop the row).
_IMAGE_PROBLEMS = ("missing_image", "not_an_image", "image_too_large", "path_outside_imgs", "no_query_images")


def incomplete_subset(manifest: Manifest) -> str | None:
    """Why ``manifest`` is not the whole subset the paper evaluates (None when it is, or for a benchmark without
    such a rule). HLE-VL must be exactly its 330 visual questions, each with every image resolving inside the
    benchmark's ``imgs/``: a table over fewer (or other) rows is not the paper's D.1."""
    if manifest.name != "hle_vl":
        return None
    lacking = {p.id for p in manifest.problems if p.kind in _IMAGE_PROBLEMS}
    no_dir = any(p.kind == "missing_image_dir" for p in manifest.problems)
    complete = [] if no_dir else [s for s in manifest.samples if s.id not in lacking]
    if len(complete) == HLE_VL_VISUAL == len(manifest.samples):
        return None
    first = next((p for p in manifest.problems if p.kind in (*_IMAGE_PROBLEMS, "missing_image_dir")), None)
    why = f" (first: line {first.line}: {first.detail})" if first else ""
    return (f"{manifest.path}: HLE-VL (paper D.1) is WebWatcher's {HLE_VL_VISUAL}-question visual subset; this file "
            f"gives {len(manifest.samples)} questions, {len(complete)} with every image inside "
            f"{manifest.path.parent / 'imgs'}{why}. Map the whole file and put its images in imgs/")
