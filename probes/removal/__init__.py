"""Step-k image-removal replays (paper §3.2.3, Figure 2(c)): accuracy when the query images go from step k on.

    python -m probes.removal RUN_DIR --steps 1..5 [--judge exact | --judge llm --judge-endpoint URL --judge-model M]
        [--backend sglang --endpoint URL --model-dir DIR] [--concurrency 8] [--out DIR]

RUN_DIR is a ReAct run (``python -m agent.run --method react``). For each trajectory and each k (paper
§3.2.3, B.5): steps 1..k-1 are kept exactly as recorded (the same responses, reasoning and observations,
retrieved images included; no tool is called for them, and the rebuilt context of step k is checked
byte for byte against the recorded one), then from step k on the *query* images are removed (their
``<image_k>`` identifiers stay; retrieved images stay) and the agent continues live with the run's
budgets, sampling and history settings. Tool calls after step k go through the run's tool cache in
``readwrite`` mode: a call the original run made is answered from the cache, a new one is made live
(or from the offline world, when the run was offline) and written back, so rerunning the probe replays
it exactly. A trajectory that ended before step k keeps its original outcome. The k replays of one
trajectory run back to back, so a server's prefix cache is reused.

A replay that ends in ``error`` or ``timeout`` (a backend failure, an unreadable image, a prefix that
does not rebuild) is a **missing pair**, not a wrong answer: it is left out of that k's accuracy and
McNemar test, counted in ``n_error``, listed in ``errors.csv``, and the command exits with status 3
while any remain (a rerun retries exactly those).

Writes ``OUT/k<K>/`` (each a run directory of the replays: judge or probe them like any run),
``OUT/outcomes.csv`` (one row per (trajectory, k): original and replayed grade), ``OUT/summary.csv``
(per paper category and overall, per k: pairs ``n``, ``n_error``, accuracy original vs removed on the
same pairs, exact McNemar p), ``OUT/errors.csv``, ``OUT/probe.json`` and the Figure 2(c) panel
``fig2c_removal.png/.pdf``. OUT defaults to ``RUN_DIR/probes/removal``. Resumable.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from agent.lazy import lazy_exports

__all__ = ['main', 'parse_steps', 'removal_probe', 'replay_one', 'replay_prefix_turns']

# loaded when first read: ``python -m probes.removal --help`` imports this package and needs none of the work
__getattr__, __dir__ = lazy_exports(__name__, {
    "replay_prefix_turns": ".replays",
    "replay_one": ".replays",
    "removal_probe": ".replays",
    "parse_steps": ".replays",
    "main": ".cli"})

if TYPE_CHECKING:
    from .cli import main
    from .replays import parse_steps, removal_probe, replay_one, replay_prefix_turns
