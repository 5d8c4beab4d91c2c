"""Smoke test users run first: one image+text request asking for top-20 logprobs, validated.

    python -m serving.check --endpoint http://localhost:30000 [--model NAME] [--backend openai|sglang --model-dir DIR]
    python -m serving.check --model-dir DIR            # in-process transformers
    python -m serving.check                            # the embedded tiny Qwen3.5 (random weights)

Checks: every token has k alternatives (up to k for a deduplicating chat server), sorted best
first; the chosen token's logprob agrees with its list (equal to its entry, or below the k-th
when it is not listed); logprobs are finite and <= 0; thinking is separated from the answer.
``--json`` prints one JSON object; the exit status is 0 only if everything is ok.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from agent.lazy import lazy_exports

__all__ = ['main']

# loaded when first read: ``python -m serving.check --help`` imports this package and needs none of the work
__getattr__, __dir__ = lazy_exports(__name__, {
    "main": ".cli"})

if TYPE_CHECKING:
    from .cli import main
