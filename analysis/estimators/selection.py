"""Which trajectories enter the probes' analyses: one written rule, shared by every probe (paper B.1, Table 10).

    from analysis.estimators.selection import select_trajectories
    kept, table = select_trajectories(run.index)      # table: Table 10 layout (model x benchmark counts)

The paper runs each backbone on all 1,727 samples and excludes "samples where the agent produced no
valid trajectory (e.g., immediate parsing failure)", keeping 5,087 trajectories (B.1, Table 10). The
paper does not spell the rule out; ours is, in this order (the first that applies is the reason):

1. ``harness_error``: the unit ended in ``error`` or ``timeout`` (the backend or a tool failed; what
   was recorded is not a trajectory the agent finished);
2. ``no_calls``: no LLM call was recorded;
3. ``first_call_unparsed``: the first LLM call's output held no valid action (an immediate parsing
   failure: the paper's example);
4. ``no_image_call``: no LLM call had a query image in its context (nothing to compare with and
   without images; e.g. a Removal@1 run).

Trajectories that ran out of budget without an answer (``no_answer``) are kept: they are valid
trajectories that simply did not answer. ``include_unparsed=True`` (the probes' ``--include-unparsed``,
recorded in their outputs) keeps rule 3's trajectories: the embedded tiny random model never emits a
valid action, so its demo would otherwise have nothing to probe.
"""
from __future__ import annotations

from collections import Counter
from typing import TypeVar

from agent.lazy import lazy_module
from agent.record import LineSummary

pd = lazy_module("pandas")  # loads on first use: a command's --help needs none of it (agent/lazy.py)

__all__ = ["REASONS", "exclusion_reason", "select_trajectories"]

L = TypeVar("L", bound=LineSummary)

REASONS = ("harness_error", "no_calls", "first_call_unparsed", "no_image_call")


def exclusion_reason(line: LineSummary, *, include_unparsed: bool = False) -> str | None:
    """Why this result line (its summary, or the whole line) is left out of the analyses (one of :data:`REASONS`),
    or None to keep it."""
    if line.status in ("error", "timeout"):
        return "harness_error"
    calls = line.calls  # the per-call summaries (a run's index holds them: no need to read the events)
    if not calls:
        return "no_calls"
    if calls[0].action == "malformed" and not include_unparsed:
        return "first_call_unparsed"
    if not any(c.n_query_images > 0 for c in calls):
        return "no_image_call"
    return None


def select_trajectories(lines: list[L], *, include_unparsed: bool = False) -> tuple[list[L], "pd.DataFrame"]:
    """(kept lines, exclusion table): the table has one row per (model, benchmark) with ``total``, one
    column per reason and ``kept``, plus an ``All`` row per model — the layout of the paper's Table 10."""

    kept, counts = [], Counter()
    keys = set()
    for ln in lines:
        key = (ln.model or "?", ln.benchmark or "?")
        keys.add(key)
        why = exclusion_reason(ln, include_unparsed=include_unparsed)
        counts[(*key, "total")] += 1
        if why is None:
            kept.append(ln)
            counts[(*key, "kept")] += 1
        else:
            counts[(*key, why)] += 1
    rows = [{"model": m, "benchmark": b, "total": counts[(m, b, "total")],
             **{r: counts[(m, b, r)] for r in REASONS}, "kept": counts[(m, b, "kept")]} for m, b in sorted(keys)]
    table = pd.DataFrame(rows, columns=["model", "benchmark", "total", *REASONS, "kept"])
    if len(table):
        allrows = table.groupby("model", as_index=False)[["total", *REASONS, "kept"]].sum()
        allrows.insert(1, "benchmark", "All")
        table = pd.concat([table, allrows], ignore_index=True)
    return kept, table
