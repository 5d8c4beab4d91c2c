"""The paper's figures from run directories and probe outputs (seaborn, colour-blind safe, PNG + PDF).

    from analysis.figures import fig1_tool_calls, fig2b_entropy, provenance_mark
    fig1_tool_calls(load_run("runs/react").calls(), "figures/out/fig1")
    fig2b_entropy(pd.read_csv("runs/react/probes/entropy-regenerate/summary.csv"), "figures/out/fig2b")

Each function takes tidy data (a DataFrame), writes ``<stem>.png`` and ``<stem>.pdf`` and returns the
matplotlib Figure. Conventions, for a reviewer: drawn at the sizes a paper uses (a panel 3.3 in wide, a
single column; a composite 7 in, a double column; 7 pt text) and legible there; axes labelled with units,
rendered math for ΔH, every point with its ``n`` and a 95% uncertainty band (bootstrap for means, Wilson
for shares and accuracies) named in the legend, integer step ticks, accuracy and share axes 0–100 %,
legends below the axes (never over data), titles wrapped to the panel and keeping the model and mode.
``mark=`` stamps a figure made from the embedded tiny model or the scripted backend (see
:func:`provenance_mark`), so such a figure can never pass for a result. No function reads a run itself,
so a notebook can feed them anything with the same columns.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from analysis.stats import bootstrap_ci, wilson_ci

__all__ = ["tool_shares", "fig1_tool_calls", "fig2a_grounding", "fig2b_entropy", "fig2b_kl", "fig2c_removal",
           "fig2_combined", "fig4_context", "fig_release", "save", "provenance_mark", "image_needed_within",
           "grounding_shares", "removal_tests_table", "context_bins", "COLUMN", "DOUBLE"]

GROUNDING = ["Image Needed", "Image-Derived", "Text Only"]
TOOL_ORDER = ["lens_search", "search", "visit"]
TOOL_LABEL = {"lens_search": "Visual Search (lens)", "search": "Text Retrieval (search)", "visit": "Web Visit"}
DELTA_H = r"$\Delta H_t = H(\tau_t) - H(\tau_t^{\mathrm{IR}})$"


#: Paper sizes (in): one column, two columns (ours: the common two-column templates' widths).
COLUMN, DOUBLE = 3.3, 7.0


def _plt():

    matplotlib.use("Agg")

    sns.set_theme(style="whitegrid", palette="colorblind", context="paper")
    plt.rcParams.update({"font.size": 7, "axes.titlesize": 7.5, "axes.labelsize": 7, "xtick.labelsize": 6,
                         "ytick.labelsize": 6, "legend.fontsize": 6, "figure.titlesize": 8, "lines.markersize": 3.5,
                         "axes.titlepad": 4})
    return plt, sns


def _wrap(title: str, width: int) -> str:

    return "\n".join(textwrap.wrap(title, width)) if len(title) > width else title


def _panel(ax, size=(COLUMN, 2.9)):
    """(seaborn, figure, axis, own): a new figure unless the caller passes the axis to draw into (an axis of
    its own subfigure, so that the panel's legend goes under the panel: :func:`_legend_outside`)."""
    plt, sns = _plt()
    if ax is None:
        fig = plt.figure(figsize=size, layout="constrained")
        return sns, fig, fig.subplots(), True
    return sns, ax.figure, ax, False


def _subpanels(plt, n_rows: int, n_cols: int, size):
    """A constrained figure of ``n_rows x n_cols`` subfigures with one axis each: every panel keeps its own
    legend below it, sized by the layout (never over a neighbour or the data)."""
    fig = plt.figure(figsize=size, layout="constrained")
    subs = np.atleast_1d(fig.subfigures(n_rows, n_cols, wspace=0.02, hspace=0.02)).ravel()
    return fig, [sf.subplots() for sf in subs]


def provenance_mark(headers) -> str | None:
    """The stamp a figure gets when any of its runs came from a model whose numbers mean nothing."""
    marks = []
    for h in headers:
        b = (h or {}).get("backend") or {}
        if b.get("kind") == "scripted":
            marks.append("SCRIPTED FAKE BACKEND: planted numbers, not a result")
        elif b.get("embedded_tiny_model"):
            marks.append("RANDOM WEIGHTS (embedded tiny model): meaningless numbers")
    return " | ".join(dict.fromkeys(marks)) or None


def save(fig, stem, mark: str | None = None) -> list[Path]:
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    if mark:
        # above everything (the legends sit at the bottom); the tight bounding box keeps it in the file
        fig.text(0.5, 1.0, mark, ha="center", va="bottom", fontsize=6.5, color="#b00020", weight="bold",
                 transform=fig.transFigure)
    paths = [stem.with_suffix(".png"), stem.with_suffix(".pdf")]
    fig.savefig(paths[0], dpi=200, bbox_inches="tight")
    fig.savefig(paths[1], bbox_inches="tight")

    plt.close(fig)  # a report draws dozens of figures: release each once written
    return paths


def _legend_outside(ax, ncol: int | None = None, **kw):
    """Below the panel, centred, as its (sub)figure's "outside" legend: the constrained layout makes room for
    it under the tick labels and the x label, whatever their height."""

    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    # fit the panel's width: ~0.045 in per character at 6 pt, ~0.4 in of handle and spacing per column
    sub = ax.figure
    width = sub.bbox.width / sub.dpi if hasattr(sub, "bbox") else COLUMN
    chars = max(12, int((width - 0.45) / 0.045))
    labels = ["\n".join(textwrap.wrap(x, chars)) or x for x in labels]
    longest = max(len(line) for x in labels for line in x.split("\n"))
    fit = max(1, int(width // (longest * 0.045 + 0.4)))
    ncol = min(ncol or 3, fit, len(labels))
    ax.figure.legend(handles, labels, frameon=False, loc="outside lower center", ncol=ncol, handlelength=1.6,
                     columnspacing=1.0, **kw)


def _title(ax, title, default, width: int = 52):
    ax.set_title(_wrap(title or default, width))


def _steps_axis(ax, steps, max_step=None):
    steps = sorted(int(s) for s in steps)
    if not steps:
        return
    hi = max_step or max(steps)
    stride = 1 if hi <= 20 else 2
    ax.set_xticks(range(1, hi + 1, stride))
    ax.set_xlim(0.4, hi + 0.6)


def tool_shares(calls, max_step: int = 20):
    """(shares %, counts): per step (rows) and tool (columns), among the tool calls issued at that step."""
    df = calls[calls["tool"].notna() & (calls["index"] <= max_step)]
    counts = df.groupby(["index", "tool"]).size().unstack(fill_value=0)
    counts = counts.reindex(columns=[t for t in TOOL_ORDER if t in counts.columns] +
                            [t for t in counts.columns if t not in TOOL_ORDER], fill_value=0)
    totals = counts.sum(axis=1)
    return counts.div(totals.where(totals > 0, 1), axis=0) * 100, counts


def fig1_tool_calls(calls, stem, *, max_step: int = 20, title: str | None = None, mark: str | None = None):
    """Figure 1: the share (%) of each tool among the tool calls issued at each step (LLM call index).

    ``calls``: one row per LLM call with ``index`` and ``tool`` (None when the call made no tool call).
    Shares, not counts (the number of tool calls behind each bar is printed above it), over steps 1..max_step.
    """
    plt, sns = _plt()
    shares, counts = tool_shares(calls, max_step)
    totals = counts.sum(axis=1)
    shares.to_csv(Path(stem).with_suffix(".csv"))  # the plotted numbers, beside the figure
    fig, ax = plt.subplots(figsize=(DOUBLE, 2.5), layout="constrained")
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
    ax.set_ylim(0, 110)
    ax.set_yticks(range(0, 101, 20))
    _steps_axis(ax, range(1, max_step + 1), max_step)
    if shares.shape[1]:
        _legend_outside(ax, ncol=3)
    else:
        ax.text(0.5, 0.5, "no tool calls in these trajectories", ha="center", va="center", transform=ax.transAxes)
    _title(ax, title, "Figure 1: tool calls by type per step (numbers: tool calls at that step)", 110)
    save(fig, stem, mark)
    return fig


def image_needed_within(steps, first: int = 5) -> float:
    """The share (%) of all Image Needed steps that lie within the first ``first`` steps (paper §3.2.1: 97.8%)."""
    needed = steps[steps["category"] == "Image Needed"]
    return float((needed["step"] <= first).mean() * 100) if len(needed) else float("nan")


def grounding_shares(steps, max_step: int = 20):
    """Figure 2(a)'s numbers: per step, n (steps labelled at t), each category's share (%) and the 95% Wilson
    interval of the Image Needed and Text Only shares (each step t holds one step per trajectory, so the n
    steps behind a bar are independent)."""


    df = steps[steps["step"] <= max_step]
    rows = []
    for t, g in df.groupby("step", sort=True):
        n = len(g)
        r = {"step": int(t), "n": n}
        for c in GROUNDING:
            k = int((g["category"] == c).sum())
            r[c] = 100.0 * k / n
            if c != "Image-Derived":
                lo, hi = wilson_ci(k, n)
                r[f"{c} ci_low"], r[f"{c} ci_high"] = 100 * lo, 100 * hi
        rows.append(r)
    return pd.DataFrame(rows)


def fig2a_grounding(steps, stem, *, max_step: int = 20, title: str | None = None, ax=None, mark: str | None = None):
    """Figure 2(a): share (%) of Image Needed / Image-Derived / Text Only among the steps at each step t, with
    n above each bar, 95% Wilson intervals on the Image Needed share (its top edge) and the Text Only share
    (its bottom edge), and the share of Image Needed steps within the first five steps in the title."""
    sns, fig, ax, own = _panel(ax)
    sh = grounding_shares(steps, max_step)
    x = sh["step"].to_numpy()
    bottom = np.zeros(len(sh))
    colors = sns.color_palette("colorblind", n_colors=3)
    for c, color in zip(GROUNDING, colors):
        ax.bar(x, sh[c].to_numpy(), bottom=bottom, color=color, label=c, width=0.8)
        bottom += sh[c].to_numpy()
    need, text = sh["Image Needed"].to_numpy(), sh["Text Only"].to_numpy()
    def err(lo, hi):  # float rounding can put a bound a hair past the point: never a negative bar
        return [np.clip(np.asarray(lo, dtype=float), 0, None), np.clip(np.asarray(hi, dtype=float), 0, None)]

    ax.errorbar(x, need, yerr=err(need - sh["Image Needed ci_low"], sh["Image Needed ci_high"] - need), fmt="none",
                ecolor="k", elinewidth=0.7, capsize=1.5)
    edge = 100 - text  # the Text Only segment's lower edge; its share's interval mirrored onto it
    ax.errorbar(x, edge, yerr=err(sh["Text Only ci_high"] - text, text - sh["Text Only ci_low"]), fmt="none",
                ecolor="0.35", elinewidth=0.7, capsize=1.5, label="95% Wilson CI")
    for xi, n in zip(x, sh["n"]):
        ax.text(xi, 101.5, f"{n}", ha="center", va="bottom", fontsize=5, color="0.35")
    within = image_needed_within(steps)
    default = "Figure 2(a): grounding of each step"
    head = title or default
    if np.isfinite(within):
        head += f"; {within:.1f}% of Image Needed steps in steps 1-5"
    ax.set_xlabel("step t (LLM call index); n above each bar")
    ax.set_ylabel("share of steps (%)")
    ax.set_ylim(0, 110)
    ax.set_yticks(range(0, 101, 20))
    _title(ax, head, default)
    _steps_axis(ax, sh["step"])
    _legend_outside(ax, ncol=2)
    if own and stem is not None:  # a panel drawn into a caller's axis is saved by the caller
        save(fig, stem, mark)
    return fig


def _series_plot(ax, summary, value, lo_col, hi_col, label_fmt, sns):
    """One line (or one per ``series``) of per-step means with a 95% band and n above each point."""
    series = list(dict.fromkeys(summary["series"])) if "series" in summary else [None]
    colors = sns.color_palette("colorblind", n_colors=max(3, len(series)))
    for j, name in enumerate(series):
        s = summary if name is None else summary[summary["series"] == name]
        s = s.sort_values("step")
        s = s[np.isfinite(s[value].astype(float))]
        if not len(s):
            continue
        pooled = name == "pooled"
        color = "k" if pooled else colors[j]
        x = s["step"].to_numpy(dtype=float)
        y = s[value].to_numpy(dtype=float)
        lo = s[lo_col].to_numpy(dtype=float) if lo_col in s else y
        hi = s[hi_col].to_numpy(dtype=float) if hi_col in s else y
        lo, hi = np.where(np.isfinite(lo), lo, y), np.where(np.isfinite(hi), hi, y)  # n = 1: no interval
        ax.fill_between(x, lo, hi, color=color, alpha=0.18 if (pooled or len(series) == 1) else 0.10, lw=0)
        ax.plot(x, y, "o-", color=color, lw=1.6 if pooled else 1.0, ms=3, label=label_fmt(name))
        if (name is None or pooled or len(series) == 1) and "n" in s:
            for xi, top, n in zip(x, hi, s["n"]):
                ax.annotate(f"{int(n)}", (xi, top), textcoords="offset points", xytext=(0, 2), ha="center",
                            fontsize=5, color="0.3")


def fig2b_entropy(summary, stem, *, title: str | None = None, ax=None, mark: str | None = None):
    """Figure 2(b): mean ΔH_t per step with its 95% bootstrap CI as a band (nats), n above each point; one line
    per ``series`` if given (the pooled one in black). With ``dH_low`` / ``dH_high`` (the probe's bounds) a
    hatched band shows where the true ΔH can lie given only the top-20 lists (ours, issue 25)."""
    sns, fig, ax, own = _panel(ax)
    ax.axhline(0.0, color="0.5", lw=0.8)
    if {"dH_low", "dH_high"} <= set(summary.columns):
        # where the true ΔH can lie given only the top-20 and the vocabulary (analysis.entropy.entropy_bounds)
        one = "series" in summary and summary["series"].nunique() == 1
        b = summary if "series" not in summary or one else summary[summary["series"] == "pooled"]
        b = b.sort_values("step")
        b = b[np.isfinite(b["dH_low"].astype(float)) & np.isfinite(b["dH_high"].astype(float))]
        if len(b):
            ax.fill_between(b["step"].to_numpy(dtype=float), b["dH_low"].to_numpy(dtype=float),
                            b["dH_high"].to_numpy(dtype=float), facecolor="none", edgecolor="0.45", hatch="////",
                            lw=0.6, label="bounds on the true ΔH (top-20 + vocabulary size)")
    _series_plot(ax, summary, "mean", "ci_low", "ci_high",
                 lambda name: f"{name}: mean, 95% bootstrap CI" if name else "mean ΔH, 95% bootstrap CI", sns)
    ax.set_xlabel("step t (LLM call index); n above each point")
    ax.set_ylabel(DELTA_H + " (nats)")
    _title(ax, title, "Figure 2(b): entropy change from the query images")
    _steps_axis(ax, summary["step"].unique() if len(summary) else [])
    ax.margins(y=0.18)
    _legend_outside(ax)
    if own and stem is not None:
        save(fig, stem, mark)
    return fig


def fig2b_forking(forking, summary, stem, *, title: str | None = None, mark: str | None = None):
    """Beside Figure 2(b) (ours, issue 25): (left) per step, the part of ΔH carried by the forking tokens — the
    run's top 20 % of think tokens by entropy, arXiv 2506.01939 — with its 95% bootstrap CI, the other tokens'
    part and ΔH itself; (right) the share of forking tokens with and without the query images."""
    plt, sns = _plt()
    fig, (a, b) = _subpanels(plt, 1, 2, (DOUBLE, 2.7))
    s = forking.sort_values("step")
    a.axhline(0.0, color="0.5", lw=0.8)
    _series_plot(a, s.assign(mean=s["dH_fork"], n=s["n_steps"]), "mean", "fork_ci_low", "fork_ci_high",
                 lambda name: "the forking tokens' part of ΔH, 95% bootstrap CI", sns)
    a.plot(s["step"].to_numpy(dtype=float), s["dH_rest"].to_numpy(dtype=float), "s:", ms=2.5, color="0.45", lw=1.0,
           label="the other tokens' part")
    al = summary.sort_values("step")
    a.plot(al["step"].to_numpy(dtype=float), al["mean"].to_numpy(dtype=float), "--", color="0.2", lw=1.0,
           label="ΔH (all think tokens)")
    a.set_xlabel("step t; n above each point")
    a.set_ylabel(DELTA_H + " (nats)")
    theta = float(s["threshold_nats"].iloc[0]) if len(s) else float("nan")
    _title(a, None, f"Where ΔH lives: forking tokens (H ≥ {theta:.2f} nats) vs the rest", width=44)
    _steps_axis(a, s["step"].unique())
    a.margins(y=0.18)
    _legend_outside(a, ncol=1)
    colors = sns.color_palette("colorblind", n_colors=3)
    b.plot(s["step"].to_numpy(dtype=float), 100 * s["share_fork_with"].to_numpy(dtype=float), "o-", ms=3,
           color=colors[0], label="with the query images")
    b.plot(s["step"].to_numpy(dtype=float), 100 * s["share_fork_without"].to_numpy(dtype=float), "s--", ms=3,
           color=colors[1], label="without")
    b.set_xlabel("step t")
    b.set_ylabel("forking think tokens (%)")
    _title(b, None, "Share of forking tokens per step", width=44)
    _steps_axis(b, s["step"].unique())
    b.set_ylim(0, None)
    _legend_outside(b, ncol=2)
    if title:
        fig.suptitle(_wrap(title, 100), fontsize=7)
    if stem is not None:
        save(fig, stem, mark)
    return fig


def fig2b_kl(summary, stem, *, title: str | None = None, ax=None, mark: str | None = None):
    """The teacher-forced influence of the images per step: mean over think tokens of KL(with ‖ without)."""
    sns, fig, ax, own = _panel(ax)
    s = summary.assign(kl_mean=summary["kl_with_without"])
    if "kl_n" in s:
        s = s.assign(n=s["kl_n"])
    _series_plot(ax, s, "kl_mean", "kl_ci_low", "kl_ci_high",
                 lambda name: f"{name}: mean KL, 95% bootstrap CI" if name else "mean KL, 95% bootstrap CI", sns)
    ax.set_xlabel("step t (LLM call index); n above each point")
    ax.set_ylabel(r"$\mathrm{KL}(p_{\mathrm{with}} \,\|\, p_{\mathrm{without}})$ (nats)")
    top = np.nanmax(np.r_[s.get("kl_ci_high", s["kl_mean"]).to_numpy(dtype=float), s["kl_mean"].to_numpy(dtype=float)]) \
        if len(s) else 1.0
    ax.set_ylim(0, (top if np.isfinite(top) and top > 0 else 1.0) * 1.18)  # room for the n labels
    _title(ax, title, "Image influence per step (teacher-forced)")
    _steps_axis(ax, s["step"].unique() if len(s) else [])
    _legend_outside(ax)
    if own and stem is not None:
        save(fig, stem, mark)
    return fig


def _p(p: float) -> str:
    if not np.isfinite(p):
        return "p=—"
    if p < 0.001:
        return "p<.001"
    return "p=" + (f"{p:.3f}" if p < 0.01 else f"{p:.2f}").removeprefix("0").rstrip("0").rstrip(".")


def removal_tests_table(summary) -> str:
    """Figure 2(c)'s paired tests per category and k, as Markdown (written beside the figure)."""
    head = ["category", "k", "n", "images kept (%)", "removed (%)", "95% CI (removed)", "lost", "gained",
            "McNemar p", "failed replays"]
    rows = []
    for r in summary.sort_values(["paper_category", "k"]).itertuples():
        rows.append([r.paper_category, str(r.k), str(r.n), f"{r.accuracy_original:.1f}", f"{r.accuracy_removed:.1f}",
                     f"[{getattr(r, 'removed_ci_low', float('nan')):.1f}, {getattr(r, 'removed_ci_high', float('nan')):.1f}]",
                     str(getattr(r, "lost", "")), str(getattr(r, "gained", "")), _p(r.mcnemar_p), str(r.n_error)])
    note = ("Step-k image removal: accuracy on the complete (original, replay) pairs; lost = correct only with the "
            "images, gained = correct only without; exact McNemar test on those discordant pairs (two-sided). "
            "Failed replays are excluded, never counted as wrong.")
    return "\n".join([note, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head),
                      *("| " + " | ".join(r) + " |" for r in rows)]) + "\n"


def fig2c_removal(summary, stem, *, title: str | None = None, ax=None, mark: str | None = None):
    """Figure 2(c): accuracy (%) when the query images are removed from step k on, per paper category.

    Lines: the replays, with a 95% Wilson band; hollow markers (dodged per category, so equal values stay
    apart): the original trajectories' accuracy on the same complete pairs. Every category's n is in its
    legend entry (per point where it varies with k); the x tick labels carry, per k, the pooled n and the
    exact McNemar p of the pooled pairs (the per-category tests: :func:`removal_tests_table`).
    """
    sns, fig, ax, own = _panel(ax)
    cats = list(dict.fromkeys(summary["paper_category"]))
    cats = [c for c in cats if c != "All"] + (["All"] if "All" in cats else [])
    colors = dict(zip(cats, sns.color_palette("colorblind", n_colors=max(3, len(cats)))))
    if "All" in colors:
        colors["All"] = (0.15, 0.15, 0.15)
    width = 0.09 * (len(cats) - 1)
    for j, cat in enumerate(cats):
        g = summary[summary["paper_category"] == cat].sort_values("k")
        k = g["k"].to_numpy(dtype=float)
        ns = sorted(set(int(n) for n in g["n"]))
        nlab = f"n={ns[0]}" if len(ns) == 1 else f"n={ns[0]}-{ns[-1]}"
        main = cat == "All"
        if "removed_ci_low" in g:
            ax.fill_between(k, g["removed_ci_low"], g["removed_ci_high"], color=colors[cat],
                            alpha=0.14 if main else 0.08, lw=0)
        ax.plot(k, g["accuracy_removed"], "o-", color=colors[cat], lw=1.6 if main else 1.0, ms=3,
                label=f"{cat} ({nlab})")
        dx = -width / 2 + 0.09 * j if len(cats) > 1 else 0.0
        ax.plot(k + dx, g["accuracy_original"], "o", mfc="none", mec=colors[cat], ms=3.2, mew=0.8)
        if len(ns) > 1:
            for xi, y, n in zip(k, g["accuracy_removed"], g["n"]):
                ax.annotate(f"{int(n)}", (xi, y), textcoords="offset points", xytext=(0, -8), ha="center",
                            fontsize=5, color=colors[cat])
    ax.plot([], [], "o", mfc="none", mec="0.3", ms=3.2, label="images kept (same pairs)")
    ax.plot([], [], "s", color="0.3", alpha=0.2, ms=6, label="95% Wilson CI (removed)")
    ax.set_xlabel("k (query images removed from step k on);\nunder each k: all categories' n, McNemar p"
                  if "All" in cats else "k (query images removed from step k on)")
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(-3, 103)
    _title(ax, title, "Figure 2(c): step-k image removal")
    if len(summary):
        ks = sorted(int(k) for k in summary["k"].unique())
        pooled = summary[summary["paper_category"] == "All"].set_index("k") if "All" in cats else None
        labels = [f"{k}\nn={int(pooled.loc[k, 'n'])}\n{_p(float(pooled.loc[k, 'mcnemar_p']))}"
                  if pooled is not None and k in pooled.index else str(k) for k in ks]
        ax.set_xticks(ks, labels, fontsize=5.5 if pooled is not None else None)
        ax.set_xlim(min(ks) - 0.5, max(ks) + 0.5)
    _legend_outside(ax, ncol=2)
    if own and stem is not None:
        save(fig, stem, mark)
        Path(stem).with_suffix(".md").write_text(removal_tests_table(summary))
    return fig


def fig2_combined(grounding_steps, entropy_summary, removal_summary, stem, *, mark: str | None = None,
                  subtitle: str | None = None, kl_summary=None):
    """Figure 2 (a)(b)(c) side by side at the width of two columns (7 in), and the KL influence as a fourth
    panel (a 2 x 2 grid) when a teacher-forced probe ran (``kl_summary``: step, kl_with_without, kl_ci_low,
    kl_ci_high, kl_n, series); a missing panel (None) is drawn as an empty, labelled axis."""
    plt, _ = _plt()
    has_kl = kl_summary is not None and "kl_with_without" in kl_summary and \
        np.isfinite(kl_summary["kl_with_without"].astype(float)).any()
    fig, axes = _subpanels(plt, 2, 2, (DOUBLE, 6.2)) if has_kl else _subpanels(plt, 1, 3, (DOUBLE, 3.3))
    panels = [(axes[0], grounding_steps, fig2a_grounding, "(a) grounding of each step"),
              (axes[1], entropy_summary, fig2b_entropy, "(b) entropy change ΔH"),
              (axes[2], removal_summary, fig2c_removal, "(c) step-k image removal")]
    if has_kl:
        panels.append((axes[3], kl_summary, fig2b_kl, "(b') image influence (KL, teacher-forced)"))
    for ax, data, fn, name in panels:
        if data is None or len(data) == 0:
            ax.text(0.5, 0.5, f"{name}: not computed", ha="center", va="center", transform=ax.transAxes)
            ax.set_axis_off()
        else:
            fn(data, None, ax=ax, title=name)
            if not has_kl:
                ax.title.set_text(_wrap(ax.get_title().replace("\n", " "), 34))
    if subtitle:
        fig.suptitle(_wrap(subtitle, 120))
    save(fig, stem, mark)
    return fig


def context_bins(samples, bins=(1, 5, 9, 13, 17, 21), by=("method",)):
    """Figure 4's numbers: per group (``by``) and trajectory-length bin, n, the mean length, the mean working
    context with its 95% bootstrap CI, and the accuracy with its 95% Wilson interval."""


    labels = [f"{lo}-{hi - 1}" for lo, hi in zip(bins[:-1], bins[1:])]
    rows = []
    for key, g in samples.groupby(list(by), sort=False):
        key = key if isinstance(key, tuple) else (key,)
        cut = np.digitize(g["n_calls"], bins[1:-1], right=False)
        for i, lab in enumerate(labels):
            gi = g[cut == i]
            if not len(gi):
                continue
            wc = gi["max_prompt_tokens"].to_numpy(dtype=float)
            lo, hi = bootstrap_ci(wc, reps=500)
            k = int(gi["correct"].sum())
            alo, ahi = wilson_ci(k, len(gi))
            rows.append({**dict(zip(by, key)), "bin": lab, "bin_index": i, "n": len(gi),
                         "mean_length": float(gi["n_calls"].mean()), "working_context": float(wc.mean()),
                         "wc_ci_low": lo, "wc_ci_high": hi, "accuracy": 100.0 * k / len(gi),
                         "acc_ci_low": 100 * alo, "acc_ci_high": 100 * ahi})
    out = pd.DataFrame(rows)
    out.attrs["labels"] = labels
    return out


def fig4_context(samples, stem, *, bins=(1, 5, 9, 13, 17, 21), mark: str | None = None, title: str | None = None):
    """Figure 4: (a) each trajectory's working context against its length, (b) accuracy against length, per method.

    ``samples``: one row per trajectory with ``method``, ``n_calls`` (trajectory length in LLM calls),
    ``max_prompt_tokens`` (working context: the largest prompt of any single call) and ``correct`` (bool).
    (a) every trajectory (light points) and the mean per length bin at the bin's mean length, with its 95%
    bootstrap CI as a band; (b) the accuracy per bin with its 95% Wilson band and the n behind each point.
    The binned numbers are written beside the figure (``stem.csv``). One model's trajectories per call: the
    caller decides what to pool (analysis.report never pools different model mixes).
    """
    plt, sns = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(DOUBLE, 2.9), layout="constrained")
    methods = list(dict.fromkeys(samples["method"]))
    colors = dict(zip(methods, sns.color_palette("colorblind", n_colors=max(3, len(methods)))))
    tab = context_bins(samples, bins)
    labels = tab.attrs["labels"]
    rng = np.random.default_rng(0)
    off = 0.08 * (len(methods) - 1)
    for j, (m, g) in enumerate(samples.groupby("method", sort=False)):
        jitter = rng.uniform(-0.25, 0.25, len(g))
        a.scatter(g["n_calls"] + jitter, g["max_prompt_tokens"], s=3, alpha=0.25, color=colors[m], linewidths=0)
        t = tab[tab["method"] == m]
        a.fill_between(t["mean_length"], t["wc_ci_low"].fillna(t["working_context"]),
                       t["wc_ci_high"].fillna(t["working_context"]), color=colors[m], alpha=0.15, lw=0)
        a.plot(t["mean_length"], t["working_context"], "o-", ms=3, lw=1.1, color=colors[m], label=m)
        x = t["bin_index"].to_numpy(dtype=float) + (-off / 2 + 0.08 * j if len(methods) > 1 else 0)
        b.fill_between(x, t["acc_ci_low"], t["acc_ci_high"], color=colors[m], alpha=0.12, lw=0)
        b.plot(x, t["accuracy"], "o-", ms=3, lw=1.1, color=colors[m], label=m)
        for xi, y, c in zip(x, t["accuracy"], t["n"]):
            b.annotate(f"{c}", (xi, y), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=5,
                       color=colors[m])
    a.set_xlim(bins[0] - 0.6, bins[-1] - 0.4)
    a.set_xticks(range(bins[0], bins[-1], max(1, (bins[-1] - bins[0]) // 10)))
    a.set_xlabel("trajectory length (LLM calls)")
    a.set_ylabel("working context (max prompt tokens)")
    a.set_title("(a) working context vs trajectory length")
    b.set_xticks(range(len(labels)), labels)
    b.set_xlabel("trajectory length (LLM calls); n above each point")
    b.set_ylabel("accuracy (%)")
    b.set_ylim(-3, 108)
    b.set_title("(b) accuracy vs trajectory length (95% Wilson band)")
    _legend_outside(b, ncol=min(4, len(methods)))  # one legend: both panels draw the same methods
    fig.suptitle(_wrap(title or "Figure 4", 120))
    tab.to_csv(Path(stem).with_suffix(".csv"), index=False)
    save(fig, stem, mark)
    return fig


def fig_release(points, steps, stem, *, mark: str | None = None, subtitle: str | None = None, hist_policy=None):
    """The adaptive image release (ours): (a) accuracy against query-image steps kept — ReAct with the images
    kept, each fixed Removal@k, each adaptive policy (ε, M): the Pareto picture; (b) when the detector released
    the images, per paper category (one adaptive policy: ``hist_policy``, default the calibrated one)."""
    plt, sns = _plt()
    fig, (ax, bx) = _subpanels(plt, 1, 2, (DOUBLE, 3.8))
    pal = sns.color_palette("colorblind", 8)
    ref = points[points["series"] == "ReAct (images kept)"]
    for r in ref.itertuples():
        ax.plot(r.image_steps, r.accuracy, marker="*", ms=9, ls="none", color="k", label=f"ReAct, images kept (n={int(r.n)})")
    for j, series in enumerate(("R@k (runs)", "R@k (replays)")):
        g = points[points["series"] == series].sort_values("k")
        if not len(g):
            continue
        ax.plot(g["image_steps"], g["accuracy"], marker="os"[j], ms=5, ls="-" if j == 0 else "--", lw=1.0,
                color=pal[j], label=f"fixed Removal@k ({'runs' if j == 0 else 'replays of the ReAct run'}; "
                                    f"n={int(g['n'].max())})")
        for r in g.itertuples():
            ax.annotate(f"k={int(r.k)}", (r.image_steps, r.accuracy), textcoords="offset points",
                        xytext=(3, -8 if j else 3), fontsize=5, color=pal[j])
    ad = points[points["series"] == "adaptive"].sort_values("threshold")
    for i, r in enumerate(ad.itertuples()):
        ax.plot(r.image_steps, r.accuracy, marker="D", ms=7, ls="none", color=pal[(i + 2) % len(pal)],
                markeredgecolor="k", markeredgewidth=0.5,
                label=f"adaptive {r.signal} ε={r.threshold:.3g}, M={int(r.patience)} (n={int(r.n)})")
    ax.set_xlabel(_wrap("query-image steps kept per trajectory (query images in context, summed over its calls)", 60))
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(-3, 108)
    ax.set_yticks(range(0, 101, 20))
    ax.set_xlim(left=-0.2)
    ax.set_title("(a) accuracy vs. images kept in context")
    _legend_outside(ax)
    if steps is None or not len(steps):
        bx.text(0.5, 0.5, "(b) no adaptive run", ha="center", va="center", transform=bx.transAxes)
        bx.set_axis_off()
    else:
        pol = hist_policy or (steps[steps["calibrated"]]["policy"].iloc[0] if steps["calibrated"].any()
                              else steps["policy"].iloc[0])
        d = steps[steps["policy"] == pol]
        never = int(np.nanmax(d["n_calls"].astype(float))) + 1 if len(d) else 1
        d = d.assign(bin=d["release_step"].fillna(never).astype(int))
        cats = [c for c in dict.fromkeys(d["paper_category"]) if c is not None]
        bins = list(range(int(min(d["bin"].min(), 2)), never + 1))
        colors = dict(zip(cats, sns.color_palette("colorblind", n_colors=max(3, len(cats)))))
        w = 0.8 / max(1, len(cats))
        for j, cat in enumerate(cats):
            dc = d[d["paper_category"] == cat]
            share = [100.0 * float((dc["bin"] == b).mean()) for b in bins]
            xs = np.arange(len(bins)) + (j - (len(cats) - 1) / 2) * w
            med = dc["release_step"].median()
            bx.bar(xs, share, width=w, color=colors[cat],
                   label=f"{cat} (n={len(dc)}; median {med:g})" if np.isfinite(med) else f"{cat} (n={len(dc)}; never)")
        bx.set_xticks(np.arange(len(bins)), [str(b) if b != never else "never" for b in bins])
        bx.set_xlabel("release step (first step without the query images)")
        bx.set_ylabel("share of the category's trajectories (%)")
        bx.set_ylim(0, 103)
        bx.set_title(_wrap(f"(b) release steps by category: {pol}", 50))
        _legend_outside(bx)
    if subtitle:
        fig.suptitle(_wrap(subtitle, 120))
    save(fig, stem, mark)
    return fig
