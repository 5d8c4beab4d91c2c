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

__all__ = ["fig1_tool_calls", "fig2a_grounding", "fig2b_entropy", "fig2c_removal", "fig2_combined", "fig4_context",
           "save"]

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


def _panel(ax, size=(5.2, 3.2)):
    """(seaborn, figure, axis, own): a new figure unless the caller passes the axis to draw into."""
    plt, sns = _plt()
    if ax is None:
        fig, ax = plt.subplots(figsize=size)
        return sns, fig, ax, True
    return sns, ax.figure, ax, False


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
    if counts.shape[1]:
        ax.legend(frameon=False, fontsize=8)
    else:
        ax.text(0.5, 0.5, "no tool calls in these trajectories", ha="center", va="center", transform=ax.transAxes)
    ax.set_title(title or "Figure 1: tool calls by type per step")
    save(fig, stem)
    return fig


def fig2b_entropy(summary, stem, *, title: str | None = None, ax=None):
    """Figure 2(b): mean ΔH_t = H(τ_t) - H(τ_t^IR) per step with 95% bootstrap CI (nats)."""
    sns, fig, ax, own = _panel(ax)
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
    if own and stem is not None:  # a panel drawn into a caller's axis is saved by the caller
        save(fig, stem)
    return fig


def fig2c_removal(summary, stem, *, title: str | None = None, ax=None):
    """Figure 2(c): accuracy (%) when the query images are removed from step k on, per paper category.

    Solid lines: replays; dashed: the original trajectories' accuracy (same samples).
    """
    sns, fig, ax, own = _panel(ax)
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
    if own and stem is not None:  # a panel drawn into a caller's axis is saved by the caller
        save(fig, stem)
    return fig


def fig2a_grounding(steps, stem, *, max_step: int = 20, title: str | None = None, ax=None):
    """Figure 2(a): share (%) of Image Needed / Image-Derived / Text Only among the steps at each step t."""
    sns, fig, ax, own = _panel(ax)
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
    if own and stem is not None:  # a panel drawn into a caller's axis is saved by the caller
        save(fig, stem)
    return fig


def fig2_combined(grounding_steps, entropy_summary, removal_summary, stem):
    """Figure 2 (a)(b)(c) side by side; a missing panel (None) is drawn as an empty, labelled axis."""
    plt, _ = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.6))
    for ax, data, fn, name in ((axes[0], grounding_steps, fig2a_grounding, "(a) grounding"),
                               (axes[1], entropy_summary, fig2b_entropy, "(b) entropy"),
                               (axes[2], removal_summary, fig2c_removal, "(c) image removal")):
        if data is None or len(data) == 0:
            ax.text(0.5, 0.5, f"{name}: not computed", ha="center", va="center", transform=ax.transAxes)
            ax.set_axis_off()
        else:
            fn(data, None, ax=ax, title=name)
    fig.tight_layout()
    save(fig, stem)
    return fig


def fig4_context(calls, samples, stem, *, bins=(1, 5, 9, 13, 17, 21)):
    """Figure 4: working context (prompt tokens of the call at step t) and accuracy vs trajectory length.

    ``calls``: one row per LLM call with ``method``, ``index``, ``prompt_tokens``; ``samples``: one row
    per trajectory with ``method``, ``n_calls`` and ``correct`` (bool).
    """
    plt, sns = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.4))
    colors = dict(zip(calls["method"].unique(), sns.color_palette("colorblind", n_colors=max(3, calls["method"].nunique()))))
    for m, g in calls.groupby("method"):
        per = g.groupby("index")["prompt_tokens"].mean()
        a.plot(per.index, per.to_numpy(), "o-", ms=3, lw=1.3, color=colors[m], label=m)
    a.set_xlabel("step t (LLM call index)")
    a.set_ylabel("prompt tokens at step t (mean)")
    a.set_title("working context vs step")
    a.legend(frameon=False, fontsize=7)
    labels = [f"{lo}-{hi - 1}" for lo, hi in zip(bins[:-1], bins[1:])]
    for m, g in samples.groupby("method"):
        cut = np.digitize(g["n_calls"], bins[1:-1], right=False)
        acc = [g["correct"][cut == i].mean() * 100 if (cut == i).any() else np.nan for i in range(len(labels))]
        b.plot(range(len(labels)), acc, "o-", ms=3, lw=1.3, color=colors.get(m), label=m)
    b.set_xticks(range(len(labels)), labels)
    b.set_xlabel("trajectory length (LLM calls)")
    b.set_ylabel("accuracy (%)")
    b.set_title("accuracy vs trajectory length")
    fig.suptitle("Figure 4")
    fig.tight_layout()
    save(fig, stem)
    return fig
