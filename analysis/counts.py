"""How many samples a benchmark has: each manifest id once (ours), against the rows the release runs.

The release iterates every manifest row, duplicates included (``pipelines/base_pipeline.py:103-116``): its
collection counts 1,727 rows (MMSearch 171, two of them repeating an earlier id). We read a repeated id once
(``agent.benchmarks``), so the same manifests give n = 1,725. Table 1 prints both counts in a footnote.
"""
from __future__ import annotations

__all__ = ["duplicates_note"]


def duplicates_note(runs) -> str:
    """The footnote for the runs' benchmarks whose manifest repeats ids ("" when none does)."""
    per: dict[str, tuple[int, int]] = {}
    for run in runs:
        h = run.header
        dups = int((h.get("manifest_problems") or {}).get("duplicate_id", 0))
        if h.get("benchmark") and isinstance(h.get("n_samples"), int):
            per[h["benchmark"]] = (h["n_samples"], dups)
    if not any(d for _, d in per.values()):
        return ""
    named = "; ".join(f"{b}: {n + d} rows, {d} repeating an earlier id, n = {n}" for b, (n, d) in sorted(per.items()) if d)
    n_all, rows_all = sum(n for n, _ in per.values()), sum(n + d for n, d in per.values())
    return (f"**n counts each manifest id once** (ours; the release runs every row, pipelines/base_pipeline.py:103-116): "
            f"{named}. Over these benchmarks: n = {n_all:,} here, {rows_all:,} rows as the release counts them.")
