"""The paper's figures from run directories and probe outputs (seaborn, colour-blind safe, PNG + PDF).

    from agent.rundir import frames
    from analysis.figures import fig1_tool_calls, fig2b_entropy, provenance_mark
    fig1_tool_calls(frames.steps("runs/react").rename(columns={"call": "index"}), "figures/out/fig1")
    fig2b_entropy(pd.read_csv("runs/react/probes/entropy-regenerate/summary.csv"), "figures/out/fig2b")

Each function takes tidy data (a DataFrame), writes ``<stem>.png`` and ``<stem>.pdf`` and returns the
matplotlib Figure. Conventions, for a reviewer: drawn at the sizes a paper uses (a panel 3.3 in wide, a
single column; a composite 7 in, a double column; 7 pt text) and legible there; axes labelled with units,
rendered math for ΔH, every point with its ``n`` and a 95% uncertainty band (BCa bootstrap for means, Wilson
for shares and accuracies) named in the legend, integer step ticks, accuracy and share axes 0–100 %,
legends below the axes (never over data), titles wrapped to the panel and keeping the model and mode.
``mark=`` stamps a figure made from the embedded tiny model or the scripted backend (see
:func:`provenance_mark`), so such a figure can never pass for a result. No function reads a run itself,
so a notebook can feed them anything with the same columns.
"""
from .context import context_bins, fig1_tool_calls, fig4_context, fig_unload, tool_shares
from .fig2 import (
                   fig2_combined,
                   fig2a_grounding,
                   fig2b_entropy,
                   fig2b_forking,
                   fig2b_kl,
                   fig2b_robustness,
                   fig2c_removal,
                   grounding_shares,
                   image_needed_within,
                   removal_tests_table,
)
from .style import COLUMN, DOUBLE, draw, provenance_mark, save, write_csv, write_text, written

__all__ = ["tool_shares", "fig1_tool_calls", "fig2a_grounding", "fig2b_entropy", "fig2b_forking", "fig2b_kl",
           "fig2b_robustness",
           "fig2c_removal", "fig2_combined", "fig4_context", "fig_unload", "save", "provenance_mark",
           "image_needed_within", "grounding_shares", "removal_tests_table", "context_bins", "COLUMN", "DOUBLE", "write_csv", "write_text", "written", "draw"]
