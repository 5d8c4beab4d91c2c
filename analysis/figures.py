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

__all__ = ["tool_shares", "fig1_tool_calls", "fig2a_grounding", "fig2b_entropy", "fig2c_removal", "fig2_combined", "fig4_context",
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
    import matplotlib.pyplot as plt

    plt.close(fig)  # a report draws dozens of figures: release each once written
    return paths


def tool_shares(calls, max_step: int = 20):
    """(shares %, counts): per step (rows) and tool (columns), among the tool calls issued at that step."""
    df = calls[calls["tool"].notna() & (calls["index"] <= max_step)]
    counts = df.groupby(["index", "tool"]).size().unstack(fill_value=0)
    counts = counts.reindex(columns=[t for t in TOOL_ORDER if t in counts.columns] +
                            [t for t in counts.columns if t not in TOOL_ORDER], fill_value=0)
    totals = counts.sum(axis=1)
    return counts.div(totals.where(totals > 0, 1), axis=0) * 100, counts


def fig1_tool_calls(calls, stem, *, max_step: int = 20, title: str | None = None):
    """Figure 1: the share (%) of each tool among the tool calls issued at each step (LLM call index).

    ``calls``: one row per LLM call with ``index`` and ``tool`` (None when the call made no tool call).
    Shares, not counts (the number of tool calls behind each bar is printed above it), over steps 1..max_step.
    """
    plt, sns = _plt()
    shares, counts = tool_shares(calls, max_step)
    totals = counts.sum(axis=1)
    shares.to_csv(Path(stem).with_suffix(".csv"))  # the plotted numbers, beside the figure
    fig, ax = plt.subplots(figsize=(7.0, 3.4))
    bottom = np.zeros(len(shares))
    colors = sns.color_palette("colorblind", n_colors=max(3, shares.shape[1]))
    for j, tool in enumerate(shares.columns):
        ax.bar(shares.index, shares[tool].to_numpy(), bottom=bottom, label=TOOL_LABEL.get(tool, tool), color=colors[j],
               width=0.8)
        bottom += shares[tool].to_numpy()
    for x, n in totals.items():
        ax.text(x, 101.5, f"{n}", ha="center", va="bottom", fontsize=5.5, color="0.35")
    ax.set_xlabel("step t (LLM call index)")
    ax.set_ylabel("share of tool calls (%)")
    ax.set_ylim(0, 108)
    ax.set_xlim(0.4, max_step + 0.6)
    ax.set_xticks(range(1, max_step + 1))
    if shares.shape[1]:
        ax.legend(frameon=False, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.text(0.5, 0.5, "no tool calls in these trajectories", ha="center", va="center", transform=ax.transAxes)
    ax.set_title(title or "Figure 1: tool calls by type per step (numbers: tool calls at that step)")
    save(fig, stem)
    return fig


def fig2b_entropy(summary, stem, *, title: str | None = None, ax=None):
    """Figure 2(b): mean ΔH_t = H(τ_t) - H(τ_t^IR) per step with 95% bootstrap CI (nats).

    ``summary``: one row per step (``step``, ``mean``, ``ci_low``, ``ci_high``, ``n``); with a ``series``
    column (several runs, e.g. three backbones, and their pool), one line per series.
    """
    sns, fig, ax, own = _panel(ax)
    series = list(dict.fromkeys(summary["series"])) if "series" in summary else [None]
    colors = sns.color_palette("colorblind", n_colors=max(3, len(series)))
    ax.axhline(0.0, color="0.5", lw=0.8)
    for j, name in enumerate(series):
        s = summary if name is None else summary[summary["series"] == name]
        s = s.sort_values("step")
        s = s[np.isfinite(s["mean"])]
        lo = (s["mean"] - s["ci_low"]).clip(lower=0).fillna(0).to_numpy()
        hi = (s["ci_high"] - s["mean"]).clip(lower=0).fillna(0).to_numpy()
        pooled = name == "pooled"
        ax.errorbar(s["step"] + (0 if pooled or name is None else 0.08 * (j - len(series) / 2)), s["mean"],
                    yerr=[lo, hi], fmt="o-", color="k" if pooled else colors[j], capsize=3, lw=2.0 if pooled else 1.2,
                    ms=4, label=f"{name} (95% CI)" if name is not None else "mean ΔH (95% CI)")
        if name is None or pooled:
            for x, y, h, n in zip(s["step"], s["mean"], s["mean"] + hi, s["n"]):
                ax.annotate(f"n={n}", (x, h), textcoords="offset points", xytext=(0, 4), ha="center", fontsize=6,
                            color="0.3")
    ax.set_xlabel("step t (LLM call index)")
    ax.set_ylabel("ΔH_t = H(τ_t) − H(τ_t^IR) (nats)")
    ax.set_title(title or "Figure 2(b): entropy change from the query images")
    steps = sorted(summary["step"].unique()) if len(summary) else []
    if steps:
        ax.set_xticks([int(x) for x in steps])
    ax.legend(frameon=False, fontsize=7)
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


def fig4_context(samples, stem, *, bins=(1, 5, 9, 13, 17, 21)):
    """Figure 4: (a) each trajectory's working context against its length, (b) accuracy against length, per method.

    ``samples``: one row per trajectory with ``method``, ``n_calls`` (trajectory length in LLM calls),
    ``max_prompt_tokens`` (working context: the largest prompt of any single call) and ``correct`` (bool).
    (a) shows every trajectory (light points) and the mean per length bin; (b) the accuracy per bin.
    """
    plt, sns = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10.5, 3.6))
    methods = list(dict.fromkeys(samples["method"]))
    colors = dict(zip(methods, sns.color_palette("colorblind", n_colors=max(3, len(methods)))))
    labels = [f"{lo}-{hi - 1}" for lo, hi in zip(bins[:-1], bins[1:])]
    centers = [(lo + hi - 1) / 2 for lo, hi in zip(bins[:-1], bins[1:])]
    rng = np.random.default_rng(0)
    for m, g in samples.groupby("method", sort=False):
        jitter = rng.uniform(-0.25, 0.25, len(g))
        a.scatter(g["n_calls"] + jitter, g["max_prompt_tokens"], s=5, alpha=0.25, color=colors[m], linewidths=0)
        cut = np.digitize(g["n_calls"], bins[1:-1], right=False)
        wc = [g["max_prompt_tokens"][cut == i].mean() if (cut == i).any() else np.nan for i in range(len(labels))]
        acc = [g["correct"][cut == i].mean() * 100 if (cut == i).any() else np.nan for i in range(len(labels))]
        a.plot(centers, wc, "o-", ms=4, lw=1.4, color=colors[m], label=m)
        b.plot(range(len(labels)), acc, "o-", ms=4, lw=1.4, color=colors[m], label=m)
    a.set_xlim(bins[0] - 0.6, bins[-1] - 0.4)
    a.set_xticks(range(bins[0], bins[-1], max(1, (bins[-1] - bins[0]) // 10)))
    a.set_xlabel("trajectory length (LLM calls)")
    a.set_ylabel("working context (max prompt tokens)")
    a.set_title("(a) working context vs trajectory length")
    b.set_xticks(range(len(labels)), labels)
    b.set_xlabel("trajectory length (LLM calls)")
    b.set_ylabel("accuracy (%)")
    b.set_ylim(0, 100)
    b.set_title("(b) accuracy vs trajectory length")
    b.legend(frameon=False, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle("Figure 4")
    fig.tight_layout()
    save(fig, stem)
    return fig
