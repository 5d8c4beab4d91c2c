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

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

__all__ = ["Sample", "Problem", "Manifest", "PAPER_CATEGORY", "load_benchmark", "load_dataset_dir", "resolve_benchmark",
           "stratified", "paper_subset", "random_per_benchmark", "load_selection", "incomplete_subset", "HLE_VL_VISUAL",
           "main"]

# loaded when first read: ``python -m agent.benchmarks --help`` imports this package and needs none of the work
__getattr__, __dir__ = lazy_exports(__name__, {
    "main": ".cli",
    **{n: ".manifest" for n in ("PAPER_CATEGORY", "Manifest", "Problem", "Sample", "load_benchmark",
                                "load_dataset_dir", "resolve_benchmark")},
    **{n: ".subsets" for n in ("HLE_VL_VISUAL", "incomplete_subset", "load_selection", "paper_subset",
                               "random_per_benchmark", "stratified")}})

if TYPE_CHECKING:
    from .cli import main
    from .manifest import PAPER_CATEGORY, Manifest, Problem, Sample, load_benchmark, load_dataset_dir, resolve_benchmark
    from .subsets import (
        HLE_VL_VISUAL,
        incomplete_subset,
        load_selection,
        paper_subset,
        random_per_benchmark,
        stratified,
    )
