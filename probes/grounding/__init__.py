"""The grounding annotator (paper §3.2.1, B.4, appendix E.6 / E.7): Image Needed / Image-Derived / Text Only per step.

    python -m probes.grounding RUN_DIR                                  # OpenRouter google/gemini-3-flash-preview ($OPENROUTER_API_KEY)
    python -m probes.grounding RUN_DIR --judge-endpoint http://gpu:30000 --judge-model qwen3.5-27b [--re-asks 2] [--limit N]

Two passes per trajectory, with the question, the query images and the steps in chronological order
(each step: its tool, reasoning, action and the observation it received, the observation cut at
``--observation-chars``): pass 1 (E.6, verbatim) labels ``image_needed``; pass 2 (E.7, verbatim, the
steps now carrying their pass-1 label) labels ``image_info_used``. Image Needed = image_needed;
Image-Derived = not image_needed and image_info_used; Text Only = neither. A reply that is not a JSON
array with one object per step and boolean labels, or that holds the invalid combination
(image_needed true, image_info_used false), is asked again up to ``--re-asks`` times and then
reported as ``invalid`` with the reason — never guessed.

Trajectories are selected by the same rule as the entropy probe (:mod:`analysis.estimators.selection`; the counts
go to ``exclusions.csv``). Writes ``OUT/labels.jsonl`` (one line per trajectory; resumable), ``steps.csv`` + ``steps.parquet``
(one row per step), ``summary.json`` (category shares per step, the share of Image Needed steps within
the first five steps, invalid counts) and the Figure 2(a) panel ``fig2a_grounding.png/.pdf``. OUT
defaults to ``RUN_DIR/probes/grounding``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from agent.lazy import lazy_exports

__all__ = ['CATEGORIES', 'LabelError', 'annotate_run', 'main', 'parse_labels', 'steps_of', 'steps_text']

# loaded when first read: ``python -m probes.grounding --help`` imports this package and needs none of the work
__getattr__, __dir__ = lazy_exports(__name__, {
    "steps_of": ".annotate",
    "steps_text": ".annotate",
    "parse_labels": ".annotate",
    "LabelError": ".annotate",
    "annotate_run": ".annotate",
    "CATEGORIES": ".annotate",
    "main": ".cli"})

if TYPE_CHECKING:
    from .annotate import CATEGORIES, LabelError, annotate_run, parse_labels, steps_of, steps_text
    from .cli import main
