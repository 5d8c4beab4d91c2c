"""The paper's figures from run directories and probe outputs (seaborn, colour-blind safe, PNG + PDF).

    from analysis.figures import fig1_tool_calls, fig2b_entropy, provenance_mark
    fig1_tool_calls(load_run("runs/react").calls(), "figures/out/fig1")
    fig2b_entropy(pd.read_csv("runs/react/probes/entropy-regenerate/summary.csv"), "figures/out/fig2b")

Each function takes tidy data (a DataFrame), writes ``<stem>.png`` and ``<stem>.pdf`` and returns the
matplotlib Figure. Conventions, for a reviewer: axes labelled with units, rendered math for ΔH, the
confidence level named in the legend, integer step ticks, accuracy and share axes 0–100 %, legends
outside the data, ``n`` per point placed above its error bar, titles that keep the model and the mode.
``mark=`` stamps a figure made from the embedded tiny model or the scripted backend (see
:func:`provenance_mark`), so such a figure can never pass for a result. No function reads a run itself,
so a notebook can feed them anything with the same columns.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["tool_shares", "fig1_tool_calls", "fig2a_grounding", "fig2b_entropy", "fig2b_kl", "fig2c_removal",
           "fig2_combined", "fig4_context", "fig_release", "save", "provenance_mark", "image_needed_within"]

GROUNDING = ["Image Needed", "Image-Derived", "Text Only"]
TOOL_ORDER = ["lens_search", "search", "visit"]
TOOL_LABEL = {"lens_search": "Visual Search (lens)", "search": "Text Retrieval (search)", "visit": "Web Visit"}
DELTA_H = r"$\Delta H_t = H(\tau_t) - H(\tau_t^{\mathrm{IR}})$"


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", palette="colorblind", context="paper")
    return plt, sns


def _panel(ax, size=(5.6, 3.3)):
    """(seaborn, figure, axis, own): a new figure unless the caller passes the axis to draw into."""
    plt, sns = _plt()
    if ax is None:
        fig, ax = plt.subplots(figsize=size)
        return sns, fig, ax, True
    return sns, ax.figure, ax, False


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
        fig.text(0.5, -0.02, mark, ha="center", va="top", fontsize=8, color="#b00020", weight="bold",
                 transform=fig.transFigure)
    paths = [stem.with_suffix(".png"), stem.with_suffix(".pdf")]
    fig.savefig(paths[0], dpi=200, bbox_inches="tight")
    fig.savefig(paths[1], bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)  # a report draws dozens of figures: release each once written
    return paths


def _legend_outside(ax, **kw):
    ax.legend(frameon=False, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), **kw)


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
    fig, ax = plt.subplots(figsize=(7.2, 3.4))
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
    ax.set_yticks(range(0, 101, 20))
    _steps_axis(ax, range(1, max_step + 1), max_step)
    if shares.shape[1]:
        _legend_outside(ax)
    else:
        ax.text(0.5, 0.5, "no tool calls in these trajectories", ha="center", va="center", transform=ax.transAxes)
    ax.set_title(title or "Figure 1: tool calls by type per step (numbers: tool calls at that step)")
    save(fig, stem, mark)
    return fig


def image_needed_within(steps, first: int = 5) -> float:
    """The share (%) of all Image Needed steps that lie within the first ``first`` steps (paper §3.2.1: 97.8%)."""
    needed = steps[steps["category"] == "Image Needed"]
    return float((needed["step"] <= first).mean() * 100) if len(needed) else float("nan")


def fig2a_grounding(steps, stem, *, max_step: int = 20, title: str | None = None, ax=None, mark: str | None = None):
    """Figure 2(a): share (%) of Image Needed / Image-Derived / Text Only among the steps at each step t,
    with the share of Image Needed steps that lie within the first five steps printed on the panel."""
    sns, fig, ax, own = _panel(ax)
    df = steps[steps["step"] <= max_step]
    shares = (df.groupby("step")["category"].value_counts(normalize=True).unstack(fill_value=0.0)
              .reindex(columns=GROUNDING, fill_value=0.0) * 100)
    bottom = np.zeros(len(shares))
    colors = sns.color_palette("colorblind", n_colors=3)
    for c, color in zip(GROUNDING, colors):
        ax.bar(shares.index, shares[c].to_numpy(), bottom=bottom, color=color, label=c, width=0.8)
        bottom += shares[c].to_numpy()
    within = image_needed_within(steps)
    if np.isfinite(within):
        ax.text(0.98, 0.96, f"{within:.1f}% of Image Needed steps\nwithin the first five steps", transform=ax.transAxes,
                ha="right", va="top", fontsize=7, bbox=dict(boxstyle="round,pad=0.3", fc="white", ec="0.7", alpha=0.9))
    ax.set_xlabel("step t (LLM call index)")
    ax.set_ylabel("share of steps (%)")
    ax.set_ylim(0, 100)
    ax.set_title(title or "Figure 2(a): grounding of each step")
    _steps_axis(ax, shares.index)
    _legend_outside(ax)
    if own and stem is not None:  # a panel drawn into a caller's axis is saved by the caller
        save(fig, stem, mark)
    return fig


def _series_plot(ax, summary, value, lo_col, hi_col, label_fmt, sns):
    """One line (or one per ``series``) of per-step means with CI bars and n above each bar."""
    series = list(dict.fromkeys(summary["series"])) if "series" in summary else [None]
    colors = sns.color_palette("colorblind", n_colors=max(3, len(series)))
    for j, name in enumerate(series):
        s = summary if name is None else summary[summary["series"] == name]
        s = s.sort_values("step")
        s = s[np.isfinite(s[value])]
        if not len(s):
            continue
        pooled = name == "pooled"
        x = s["step"] + (0 if pooled or name is None or len(series) == 1 else 0.1 * (j - (len(series) - 1) / 2))
        if lo_col in s and hi_col in s:
            lo = (s[value] - s[lo_col]).clip(lower=0).fillna(0).to_numpy()
            hi = (s[hi_col] - s[value]).clip(lower=0).fillna(0).to_numpy()
        else:
            lo = hi = np.zeros(len(s))
        ax.errorbar(x, s[value], yerr=[lo, hi], fmt="o-", color="k" if pooled else colors[j], capsize=3,
                    lw=2.0 if pooled else 1.3, ms=4, label=label_fmt(name))
        if (name is None or pooled or len(series) == 1) and "n" in s:
            for xi, top, n in zip(x, s[value] + hi, s["n"]):
                ax.annotate(f"n={int(n)}", (xi, top), textcoords="offset points", xytext=(0, 5), ha="center",
                            fontsize=6, color="0.3")


def fig2b_entropy(summary, stem, *, title: str | None = None, ax=None, mark: str | None = None):
    """Figure 2(b): mean ΔH_t per step with its 95% bootstrap CI (nats); one line per ``series`` if given."""
    sns, fig, ax, own = _panel(ax)
    ax.axhline(0.0, color="0.5", lw=0.8)
    _series_plot(ax, summary, "mean", "ci_low", "ci_high",
                 lambda name: f"{name}: mean, 95% bootstrap CI" if name else "mean ΔH, 95% bootstrap CI", sns)
    ax.set_xlabel("step t (LLM call index)")
    ax.set_ylabel(DELTA_H + " (nats)")
    ax.set_title(title or "Figure 2(b): entropy change from the query images")
    _steps_axis(ax, summary["step"].unique() if len(summary) else [])
    ax.margins(y=0.15)
    _legend_outside(ax)
    if own and stem is not None:
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
    ax.set_xlabel("step t (LLM call index)")
    ax.set_ylabel(r"$\mathrm{KL}(p_{\mathrm{with}} \,\|\, p_{\mathrm{without}})$ (nats)")
    top = np.nanmax(np.r_[s.get("kl_ci_high", s["kl_mean"]).to_numpy(dtype=float), s["kl_mean"].to_numpy(dtype=float)]) \
        if len(s) else 1.0
    ax.set_ylim(0, (top if np.isfinite(top) and top > 0 else 1.0) * 1.15)  # room for the n labels
    ax.set_title(title or "Image influence per step (teacher-forced)")
    _steps_axis(ax, s["step"].unique() if len(s) else [])
    _legend_outside(ax)
    if own and stem is not None:
        save(fig, stem, mark)
    return fig


def fig2c_removal(summary, stem, *, title: str | None = None, ax=None, mark: str | None = None):
    """Figure 2(c): accuracy (%) when the query images are removed from step k on, per paper category.

    Solid lines: replays; dashed: the original trajectories' accuracy on the same (complete) pairs.
    """
    sns, fig, ax, own = _panel(ax)
    cats = list(dict.fromkeys(summary["paper_category"]))
    cats = [c for c in cats if c != "All"] + (["All"] if "All" in cats else [])
    colors = dict(zip(cats, sns.color_palette("colorblind", n_colors=max(3, len(cats)))))
    if "All" in colors:
        colors["All"] = (0.2, 0.2, 0.2)
    for cat in cats:
        g = summary[summary["paper_category"] == cat].sort_values("k")
        ax.plot(g["k"], g["accuracy_removed"], "o-", color=colors[cat], lw=2.0 if cat == "All" else 1.3, ms=4, label=cat)
        ax.plot(g["k"], g["accuracy_original"], "--", color=colors[cat], lw=0.9, alpha=0.7)
    ax.plot([], [], "--", color="0.4", lw=0.9, label="(dashed: images kept)")
    ax.set_xlabel("k (query images removed from step k on)")
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(-3, 103)
    ax.set_title(title or "Figure 2(c): step-k image removal")
    if len(summary):
        ax.set_xticks(sorted(int(k) for k in summary["k"].unique()))
    _legend_outside(ax)
    if own and stem is not None:
        save(fig, stem, mark)
    return fig


def fig2_combined(grounding_steps, entropy_summary, removal_summary, stem, *, mark: str | None = None,
                  subtitle: str | None = None, kl_summary=None):
    """Figure 2 (a)(b)(c) side by side, and the KL influence as a fourth panel when a teacher-forced probe
    ran (``kl_summary``: step, kl_with_without, kl_ci_low, kl_ci_high, kl_n, series); a missing panel (None)
    is drawn as an empty, labelled axis."""
    plt, _ = _plt()
    has_kl = kl_summary is not None and "kl_with_without" in kl_summary and \
        np.isfinite(kl_summary["kl_with_without"].astype(float)).any()
    n = 4 if has_kl else 3
    fig, axes = plt.subplots(1, n, figsize=(5.6 * n, 3.8))
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
    if subtitle:
        fig.suptitle(subtitle, fontsize=10)
    fig.tight_layout()
    save(fig, stem, mark)
    return fig


def fig4_context(samples, stem, *, bins=(1, 5, 9, 13, 17, 21), mark: str | None = None):
    """Figure 4: (a) each trajectory's working context against its length, (b) accuracy against length, per method.

    ``samples``: one row per trajectory with ``method``, ``n_calls`` (trajectory length in LLM calls),
    ``max_prompt_tokens`` (working context: the largest prompt of any single call) and ``correct`` (bool).
    (a) shows every trajectory (light points) and the mean per length bin (at the bin's mean length); (b) the
    accuracy per bin, with
    the number of trajectories behind each point.
    """
    plt, sns = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
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
        xs = [g["n_calls"][cut == i].mean() if (cut == i).any() else c for i, c in enumerate(centers)]
        acc = [g["correct"][cut == i].mean() * 100 if (cut == i).any() else np.nan for i in range(len(labels))]
        cnt = [int((cut == i).sum()) for i in range(len(labels))]
        a.plot(xs, wc, "o-", ms=4, lw=1.4, color=colors[m], label=m)  # each bin at its trajectories' mean length
        b.plot(range(len(labels)), acc, "o-", ms=4, lw=1.4, color=colors[m], label=m)
        for i, (y, c) in enumerate(zip(acc, cnt)):
            if c:
                b.annotate(f"n={c}", (i, y), textcoords="offset points", xytext=(0, 5), ha="center", fontsize=5.5,
                           color=colors[m])
    a.set_xlim(bins[0] - 0.6, bins[-1] - 0.4)
    a.set_xticks(range(bins[0], bins[-1], max(1, (bins[-1] - bins[0]) // 10)))
    a.set_xlabel("trajectory length (LLM calls)")
    a.set_ylabel("working context (max prompt tokens)")
    a.set_title("(a) working context vs trajectory length")
    b.set_xticks(range(len(labels)), labels)
    b.set_xlabel("trajectory length (LLM calls)")
    b.set_ylabel("accuracy (%)")
    b.set_ylim(-3, 108)
    b.set_title("(b) accuracy vs trajectory length")
    _legend_outside(b)
    fig.suptitle("Figure 4")
    fig.tight_layout()
    save(fig, stem, mark)
    return fig


def fig_release(points, steps, stem, *, mark: str | None = None, subtitle: str | None = None, hist_policy=None):
    """The adaptive image release (ours): (a) accuracy against query-image steps kept — ReAct with the images
    kept, each fixed Removal@k, each adaptive policy (ε, M): the Pareto picture; (b) when the detector released
    the images, per paper category (one adaptive policy: ``hist_policy``, default the calibrated one)."""
    plt, sns = _plt()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(14.5, 4.2), gridspec_kw={"width_ratios": [1, 1]})
    pal = sns.color_palette("colorblind", 8)
    ref = points[points["series"] == "ReAct (images kept)"]
    for r in ref.itertuples():
        ax.plot(r.image_steps, r.accuracy, marker="*", ms=14, ls="none", color="k", label=f"ReAct, images kept (n={int(r.n)})")
    for j, series in enumerate(("R@k (runs)", "R@k (replays)")):
        g = points[points["series"] == series].sort_values("k")
        if not len(g):
            continue
        ax.plot(g["image_steps"], g["accuracy"], marker="os"[j], ms=5, ls="-" if j == 0 else "--", lw=1.0,
                color=pal[j], label=f"fixed Removal@k ({'runs' if j == 0 else 'replays of the ReAct run'}; "
                                    f"n={int(g['n'].max())})")
        for r in g.itertuples():
            ax.annotate(f"k={int(r.k)}", (r.image_steps, r.accuracy), textcoords="offset points",
                        xytext=(4, -10 if j else 4), fontsize=6.5, color=pal[j])
    ad = points[points["series"] == "adaptive"].sort_values("threshold")
    for i, r in enumerate(ad.itertuples()):
        ax.plot(r.image_steps, r.accuracy, marker="D", ms=7, ls="none", color=pal[(i + 2) % len(pal)],
                markeredgecolor="k", markeredgewidth=0.5,
                label=f"adaptive {r.signal} ε={r.threshold:.3g}, M={int(r.patience)} (n={int(r.n)})")
    ax.set_xlabel("query-image steps kept per trajectory (query images in context, summed over its calls)")
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
        bx.set_title(f"(b) release steps by category: {pol}")
        _legend_outside(bx)
    if subtitle:
        fig.suptitle(subtitle, fontsize=10)
    fig.tight_layout()
    save(fig, stem, mark)
    return fig
