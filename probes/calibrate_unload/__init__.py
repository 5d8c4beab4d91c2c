"""Calibrate the adaptive image unloading (ε and M) for a model from a ReAct run and its removal replays (ours).

    python -m probes.calibrate_unload RUN_DIR [--signal kl|dH] [--patience 1,2,3] [--out DIR]

RUN_DIR is a ReAct run with images kept throughout, on which both probes have run:
``python -m probes.entropy RUN_DIR --mode teacher-forced`` (each step's influence: mean KL(with ‖ without)
over think tokens, and ΔH_t) and ``python -m probes.removal RUN_DIR --steps 1..5`` (the outcome when the
query images go from step k on). The procedure (ours; the paper proposes adaptive unloading as future work, §5):

1. **Label the steps.** Step t of a trajectory is *still needed* when removing the images from step t+1 on
   changed the trajectory's outcome (replay of k = t+1 graded differently from the original), *done* when
   it did not. Only complete pairs count (a failed replay is missing, never a label); trajectories that
   ended before k carry no label for it; t+1 must be one of the replayed k.
2. **ε** = the threshold on the step's influence that best separates the two: the maximum of Youden's
   J = TPR + TNR − 1 (influence ≥ ε on needed steps, < ε on done ones) over the midpoints between observed
   values; among equal J the smallest ε (the conservative one: it keeps the images longer).
3. **M** = the patience that, with that ε, gives the best estimated accuracy (ties: fewer query-image steps
   kept; an estimate that leaves trajectories uncovered ranks after every fully covered one). The estimate replays the policy on the recorded influences: a trajectory unloaded at step r
   takes the outcome of its k = r replay; one never unloaded (or unloaded after its last step) keeps its
   original outcome; one unloaded at an r that was not replayed is *uncovered* and left out (counted).

Writes ``OUT/calibration.json`` (the choice, its J / TPR / TNR, the estimated accuracy and image steps,
the model and judge it holds for), ``OUT/calibration.csv`` (every ε candidate × M: J, estimated accuracy,
coverage, mean image steps kept, mean unload step) and ``OUT/steps.csv`` (the labelled steps). OUT
defaults to ``RUN_DIR/probes/calibrate_unload``. Use the choice with
``python -m agent.run --method react --image-unload adaptive --unload-threshold OUT/calibration.json``.
The calibration holds for the model, benchmark mix and judge it was made with; the header of every
adaptive run records the file (and its hash) it took ε and M from.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from agent.lazy import lazy_exports

__all__ = ['calibrate', 'labelled_steps', 'main', 'simulate']

# loaded when first read: ``python -m probes.calibrate_unload --help`` imports this package and needs none of the work
__getattr__, __dir__ = lazy_exports(__name__, {
    "calibrate": ".calibrate",
    "labelled_steps": ".calibrate",
    "simulate": ".calibrate",
    "main": ".cli"})

if TYPE_CHECKING:
    from .calibrate import calibrate, labelled_steps, simulate
    from .cli import main
