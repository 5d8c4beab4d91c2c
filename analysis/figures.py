"""The paper's figures from run directories and probe outputs (seaborn, colour-blind safe, PNG + PDF).

    from analysis.figures import fig1_tool_calls, fig2b_entropy
    fig1_tool_calls(load_run("runs/react").calls(), "figures/out/fig1")
    fig2b_entropy(pd.read_csv("runs/react/probes/entropy-regenerate/summary.csv"), "figures/out/fig2b")

Each function takes tidy data (a DataFrame), writes ``<stem>.png`` and ``<stem>.pdf`` and returns the
matplotlib Figure; axes are labelled with units. No function reads a run itself, so a notebook can
feed them anything with the same columns.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["fig1_tool_calls", "fig2a_grounding", "fig2b_entropy", "fig2c_removal", "save"]

GROUNDING = ["Image Needed", "Image-Derived", "Text Only"]

TOOL_ORDER = ["lens_search", "search", "visit"]
TOOL_LABEL = {"lens_search": "Visual Search (lens)", "search": "Text Retrieval (search)", "visit": "Web Visit"}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", palette="colorblind", context="paper")
    return plt, sns


def save(fig, stem) -> list[Path]:
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(".png"), stem.with_suffix(".pdf")]
    fig.savefig(paths[0], dpi=200, bbox_inches="tight")
    fig.savefig(paths[1], bbox_inches="tight")
    return paths


def fig1_tool_calls(calls, stem, *, max_step: int = 20, title: str | None = None):
    """Figure 1: number of tool calls of each type issued at each step (LLM call index)."""
    plt, sns = _plt()
    df = calls[calls["tool"].notna() & (calls["index"] <= max_step)]
    counts = df.groupby(["index", "tool"]).size().unstack(fill_value=0)
    counts = counts.reindex(columns=[t for t in TOOL_ORDER if t in counts.columns] +
                            [t for t in counts.columns if t not in TOOL_ORDER], fill_value=0)
    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    bottom = np.zeros(len(counts))
    colors = sns.color_palette("colorblind", n_colors=max(3, counts.shape[1]))
    for j, tool in enumerate(counts.columns):
        ax.bar(counts.index, counts[tool].to_numpy(), bottom=bottom, label=TOOL_LABEL.get(tool, tool), color=colors[j])
        bottom += counts[tool].to_numpy()
    ax.set_xlabel("step t (LLM call index)")
    ax.set_ylabel("tool calls (count)")
    ax.set_xticks(range(1, max_step + 1) if counts.empty else counts.index)
    ax.legend(frameon=False, fontsize=8)
    ax.set_title(title or "Figure 1: tool calls by type per step")
    save(fig, stem)
    return fig


def fig2b_entropy(summary, stem, *, title: str | None = None, ax=None):
    """Figure 2(b): mean ΔH_t = H(τ_t) - H(τ_t^IR) per step with 95% bootstrap CI (nats)."""
    plt, sns = _plt()
    own = ax is None
    if own:
        fig, ax = plt.subplots(figsize=(5.2, 3.2))
    else:
        fig = ax.figure
    s = summary.sort_values("step")
    s = s[np.isfinite(s["mean"])]
    color = sns.color_palette("colorblind")[0]
    ax.axhline(0.0, color="0.5", lw=0.8)
    lo = (s["mean"] - s["ci_low"]).clip(lower=0).fillna(0).to_numpy()
    hi = (s["ci_high"] - s["mean"]).clip(lower=0).fillna(0).to_numpy()
    ax.errorbar(s["step"], s["mean"], yerr=[lo, hi], fmt="o-", color=color, capsize=3, lw=1.4, ms=4,
                label="mean ΔH (95% CI)")
    for x, y, n in zip(s["step"], s["mean"], s["n"]):
        ax.annotate(f"n={n}", (x, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=6, color="0.3")
    ax.set_xlabel("step t (LLM call index)")
    ax.set_ylabel("ΔH_t = H(τ_t) − H(τ_t^IR) (nats)")
    ax.set_title(title or "Figure 2(b): entropy change from the query images")
    if len(s):
        ax.set_xticks(s["step"].tolist())
    if own:
        save(fig, stem)
    return fig


def fig2c_removal(summary, stem, *, title: str | None = None, ax=None):
    """Figure 2(c): accuracy (%) when the query images are removed from step k on, per paper category.

    Solid lines: replays; dashed: the original trajectories' accuracy (same samples).
    """
    plt, sns = _plt()
    own = ax is None
    if own:
        fig, ax = plt.subplots(figsize=(5.2, 3.2))
    else:
        fig = ax.figure
    cats = list(dict.fromkeys(summary["paper_category"]))
    colors = dict(zip(cats, sns.color_palette("colorblind", n_colors=max(3, len(cats)))))
    for cat in cats:
        g = summary[summary["paper_category"] == cat].sort_values("k")
        ax.plot(g["k"], g["accuracy_removed"], "o-", color=colors[cat], lw=1.4, ms=4, label=cat)
        ax.plot(g["k"], g["accuracy_original"], "--", color=colors[cat], lw=0.9, alpha=0.8)
    ax.set_xlabel("k (query images removed from step k on)")
    ax.set_ylabel("accuracy (%)")
    ax.set_title(title or "Figure 2(c): step-k image removal (dashed: original)")
    if len(summary):
        ax.set_xticks(sorted(summary["k"].unique()))
    ax.legend(frameon=False, fontsize=7)
    if own:
        save(fig, stem)
    return fig


def fig2a_grounding(steps, stem, *, max_step: int = 20, title: str | None = None, ax=None):
    """Figure 2(a): share (%) of Image Needed / Image-Derived / Text Only among the steps at each step t."""
    plt, sns = _plt()
    own = ax is None
    if own:
        fig, ax = plt.subplots(figsize=(5.2, 3.2))
    else:
        fig = ax.figure
    df = steps[steps["step"] <= max_step]
    shares = (df.groupby("step")["category"].value_counts(normalize=True).unstack(fill_value=0.0)
              .reindex(columns=GROUNDING, fill_value=0.0) * 100)
    bottom = np.zeros(len(shares))
    colors = sns.color_palette("colorblind", n_colors=3)
    for c, color in zip(GROUNDING, colors):
        ax.bar(shares.index, shares[c].to_numpy(), bottom=bottom, color=color, label=c)
        bottom += shares[c].to_numpy()
    ax.set_xlabel("step t (LLM call index)")
    ax.set_ylabel("share of steps (%)")
    ax.set_ylim(0, 100)
    ax.set_title(title or "Figure 2(a): grounding of each step")
    if len(shares):
        ax.set_xticks(shares.index.tolist())
    ax.legend(frameon=False, fontsize=7)
    if own:
        save(fig, stem)
    return fig
