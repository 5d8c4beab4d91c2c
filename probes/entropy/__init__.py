"""The entropy probe (paper §3.2.2, B.4): think-segment entropy at step t with vs without the query images.

    python -m probes.entropy                                   # the embedded demo, end to end (random model!)
    python -m probes.entropy RUN_DIR [--mode regenerate|teacher-forced] [--backend sglang --endpoint URL
        --model-dir DIR | --backend local --model-dir DIR] [--concurrency 8] [--limit N] [--out DIR]

For every LLM call (step t) of every trajectory in RUN_DIR whose context held query images, τ_t is the
call's recorded messages (each step's reasoning included, as the agent saw it) and τ_t^IR the same
messages with the *query* image parts dropped (their ``<image_k>`` text identifiers kept; images that a
tool retrieved stay, paper B.5). Trajectories are selected by the shared rule of
:mod:`analysis.estimators.selection` (paper B.1, Table 10); the exclusion counts are printed and saved as
``exclusions.csv``. The probe must query the model that recorded the run (checked; ``--force``). H(τ) is the mean grouped-tail entropy (top-20 + one tail bin, nats; a lower
bound on the exact entropy) over the think tokens of the response; ΔH_t = H(τ_t) - H(τ_t^IR)
(positive: the images raise the entropy).

- ``regenerate`` (the paper's setting): H(τ_t) from the recorded response, H(τ_t^IR) from a new
  response sampled under τ_t^IR with the same sampling parameters and the same logprob semantics
  (checked: a scaled generation is never paired with a raw one).
- ``teacher-forced``: the recorded response scored under both τ_t and τ_t^IR (same tokens, both raw,
  lower variance; needs a backend that scores: ``local`` or ``sglang``). Also reports, per step, the
  mean over think tokens of KL(with || without) on the union of both top-20 supports plus a tail bin.

Where the backend computes exact entropy (in-process), the exact values and the gap of the grouped
estimate are reported too. Writes ``OUT/steps.jsonl`` (resumable: a rerun probes only missing steps),
``steps.parquet`` + ``steps.csv`` (one row per (trajectory, step)), in teacher-forced mode also
``tokens/<key>.parquet`` (per trajectory, per think token of each step: ΔH and KL, for the trajectory viewer), ``summary.csv`` (per step: n, mean
ΔH, 95% bootstrap CI, Wilcoxon signed-rank p; calls without think tokens are excluded and counted) and
the Figure 2(b) panel ``fig2b_entropy.png/.pdf``. OUT defaults to ``RUN_DIR/probes/entropy-<mode>``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from agent.lazy import lazy_exports

__all__ = ["probe_run", "main", "MODES", "SUPPORTED_METHODS", "TokenStore", "read_step_tokens", "PARTIAL",
           "bounds_by_step", "bounds_calibration", "vocab_of"]

# loaded when first read: ``python -m probes.entropy --help`` imports this package and needs none of the work
__getattr__, __dir__ = lazy_exports(__name__, {
    "main": ".cli", "MODES": ".probe", "SUPPORTED_METHODS": ".probe", "probe_run": ".probe",
    "bounds_by_step": ".step", "bounds_calibration": ".step", "vocab_of": ".step",
    "PARTIAL": ".store", "TokenStore": ".store", "read_step_tokens": ".store"})

if TYPE_CHECKING:
    from .cli import main
    from .probe import MODES, SUPPORTED_METHODS, probe_run
    from .step import bounds_by_step, bounds_calibration, vocab_of
    from .store import PARTIAL, TokenStore, read_step_tokens
