"""Figure 2 (paper §3.2): (a) grounding shares per step, (b) ΔH per step with its bounds, forking tokens and the
images' KL influence, (c) accuracy after step-k image removal; and the three panels combined.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from agent.lazy import lazy_module
from analysis.estimators.stats import wilson_ci

from .style import (
    DELTA_H,
    DOUBLE,
    GROUNDING,
    count_label,
    legend_outside,
    panel_axes,
    pyplot,
    save,
    set_title,
    steps_axis,
    subpanels,
    upright_counts,
    wrap,
    write_text,
)

pd = lazy_module("pandas")  # loads on first use: a command's --help needs none of it (agent/lazy.py)


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
    n above each bar, 95% Wilson intervals on the Image Needed share (its top edge, left of centre) and the Text
    Only share (its bottom edge, right of centre: dodged so they never overlay), and the share of Image Needed
    steps within the first five steps in the title."""
    sns, fig, ax, own = panel_axes(ax)
    sh = grounding_shares(steps, max_step)
    x = sh["step"].to_numpy()
    bottom = np.zeros(len(sh))
    colors = sns.color_palette("colorblind", n_colors=3)
    for c, color in zip(GROUNDING, colors):  # a category with no step is left out of the legend (nothing drawn)
        ax.bar(x, sh[c].to_numpy(), bottom=bottom, color=color, label=c if sh[c].sum() > 0 else None, width=0.8)
        bottom += sh[c].to_numpy()
    need, text = sh["Image Needed"].to_numpy(), sh["Text Only"].to_numpy()
    def err(lo, hi):  # float rounding can put a bound a hair past the point: never a negative bar
        return [np.clip(np.asarray(lo, dtype=float), 0, None), np.clip(np.asarray(hi, dtype=float), 0, None)]

    # dodged (left: Image Needed, right: Text Only): where Image-Derived is empty the two edges meet and the
    # intervals would overlay each other
    ax.errorbar(x - 0.17, need, yerr=err(need - sh["Image Needed ci_low"], sh["Image Needed ci_high"] - need),
                fmt="none", ecolor="k", elinewidth=0.7, capsize=1.5, clip_on=False,
                label="95% Wilson CI of the Image Needed share (black, left)")
    edge = 100 - text  # the Text Only segment's lower edge; its share's interval mirrored onto it
    ax.errorbar(x + 0.17, edge, yerr=err(sh["Text Only ci_high"] - text, text - sh["Text Only ci_low"]), fmt="none",
                ecolor="0.45", elinewidth=0.7, capsize=1.5, clip_on=False,
                label="95% Wilson CI of the Text Only share (grey, right)")
    for xi, n in zip(x, sh["n"]):
        ax.text(xi, 101.5, count_label(n), ha="center", va="bottom", fontsize=5, color="0.35",
                rotation=upright_counts(len(x)))
    within = image_needed_within(steps)
    default = "Figure 2(a): grounding of each step"
    head = title or default
    if np.isfinite(within):
        head += f"; {within:.1f}% of Image Needed steps in steps 1-5"
    ax.set_xlabel("step t (LLM call index); n above each bar")
    ax.set_ylabel("share of steps (%)")
    ax.set_ylim(0, 110)
    ax.set_yticks(range(0, 101, 20))
    set_title(ax, head, default)
    steps_axis(ax, sh["step"])
    legend_outside(ax, ncol=2)
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
                ax.annotate(count_label(n), (xi, top), textcoords="offset points", xytext=(0, 2), ha="center",
                            va="bottom", fontsize=5, color="0.3", rotation=upright_counts(len(x)))


#: A band narrower than this share of the panel's drawn span (~3 pixels of a paper-sized panel) is not seen as a
#: band: Figure 2(b) draws such bounds as a line (ours).
VISIBLE_SHARE = 0.01


def fig2b_entropy(summary, stem, *, title: str | None = None, ax=None, mark: str | None = None):
    """Figure 2(b): mean ΔH_t per step with its 95% bootstrap CI as a band (nats), n above each point; one line
    per ``series`` if given (the pooled one in black). With ``dH_low`` / ``dH_high`` (the probe's bounds) a
    hatched band shows where the true ΔH can lie given only the top-20 lists (ours); where the band would be too
    thin to see at the axis' scale (under :data:`VISIBLE_SHARE` of the drawn data's span) it is a dotted line, and
    the legend says how wide the bounds are."""
    sns, fig, ax, own = panel_axes(ax)
    ax.axhline(0.0, color="0.5", lw=0.8)
    if {"dH_low", "dH_high"} <= set(summary.columns):
        # where the true ΔH can lie given only the top-20 and the vocabulary (analysis.estimators.entropy.entropy_bounds)
        one = "series" in summary and summary["series"].nunique() == 1
        b = summary if "series" not in summary or one else summary[summary["series"] == "pooled"]
        b = b.sort_values("step")
        b = b[np.isfinite(b["dH_low"].astype(float)) & np.isfinite(b["dH_high"].astype(float))]
        lo, hi = b["dH_low"].to_numpy(dtype=float), b["dH_high"].to_numpy(dtype=float)
        cols = [c for c in ("mean", "ci_low", "ci_high", "dH_low", "dH_high") if c in summary]
        drawn = np.append(summary[cols].to_numpy(dtype=float).ravel(), 0.0)  # the zero line is drawn too
        span = float(np.nanmax(drawn) - np.nanmin(drawn)) if np.isfinite(drawn).any() else 0.0
        width = float(np.nanmax(hi - lo)) if len(b) else 0.0
        if len(b) and width > VISIBLE_SHARE * span:
            ax.fill_between(b["step"].to_numpy(dtype=float), lo, hi, facecolor="none", edgecolor="0.45",
                            hatch="////", lw=0.6, label="bounds on the true ΔH (top-20 + vocabulary size)")
        elif len(b):  # a band of zero width would be an invisible legend entry: the bounds meet, drawn as a line
            ax.plot(b["step"].to_numpy(dtype=float), (lo + hi) / 2, ls=(0, (1, 1.5)), color="0.35", lw=1.0,
                    label="bounds on the true ΔH coincide at this scale" + (f" (at most {width:.1g} nats apart)"
                                                                           if width > 0 else " (the estimate is exact)"))
    _series_plot(ax, summary, "mean", "ci_low", "ci_high",
                 lambda name: f"{name}: mean, 95% bootstrap CI" if name else "mean ΔH, 95% bootstrap CI", sns)
    ax.set_xlabel("step t (LLM call index); n above each point")
    ax.set_ylabel(DELTA_H + " (nats)")
    set_title(ax, title, "Figure 2(b): entropy change from the query images")
    steps_axis(ax, summary["step"].unique() if len(summary) else [])
    ax.margins(y=0.18)
    legend_outside(ax)
    if own and stem is not None:
        save(fig, stem, mark)
    return fig


def fig2b_forking(forking, summary, stem, *, title: str | None = None, mark: str | None = None):
    """Beside Figure 2(b) (ours, issue 25): (left) per step, the part of ΔH carried by the forking tokens — the
    run's top 20 % of think tokens by entropy, arXiv 2506.01939 — with its 95% bootstrap CI, the other tokens'
    part and ΔH itself; (right) the share of forking tokens with and without the query images."""
    plt, sns = pyplot()
    fig, (a, b) = subpanels(plt, 1, 2, (DOUBLE, 2.7))
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
    set_title(a, None, f"Where ΔH lives: forking tokens (H ≥ {theta:.2f} nats) vs the rest", width=44)
    steps_axis(a, s["step"].unique())
    a.margins(y=0.18)
    legend_outside(a, ncol=1)
    colors = sns.color_palette("colorblind", n_colors=3)
    b.plot(s["step"].to_numpy(dtype=float), 100 * s["share_fork_with"].to_numpy(dtype=float), "o-", ms=3,
           color=colors[0], label="with the query images")
    b.plot(s["step"].to_numpy(dtype=float), 100 * s["share_fork_without"].to_numpy(dtype=float), "s--", ms=3,
           color=colors[1], label="without")
    b.set_xlabel("step t")
    b.set_ylabel("forking think tokens (%)")
    set_title(b, None, "Share of forking tokens per step", width=44)
    steps_axis(b, s["step"].unique())
    b.set_ylim(0, None)
    legend_outside(b, ncol=2)
    if title:
        fig.suptitle(wrap(title, 100), fontsize=7)
    if stem is not None:
        save(fig, stem, mark)
    return fig


def fig2b_kl(summary, stem, *, title: str | None = None, ax=None, mark: str | None = None):
    """The teacher-forced influence of the images per step: mean over think tokens of KL(with ‖ without)."""
    sns, fig, ax, own = panel_axes(ax)
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
    set_title(ax, title, "Image influence per step (teacher-forced)")
    steps_axis(ax, s["step"].unique() if len(s) else [])
    legend_outside(ax)
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

    Lines: the replays; the pooled 95% Wilson band filled, each category's interval a bar right of each k in its
    colour; hollow diamonds left of each k, one column per category (equal values stay apart): the original
    trajectories' accuracy on the same complete pairs. Every category's n is in its
    legend entry (per point where it varies with k); the x tick labels carry, per k, the pooled n and the
    exact McNemar p of the pooled pairs (the per-category tests: :func:`removal_tests_table`).
    """
    sns, fig, ax, own = panel_axes(ax)
    cats = list(dict.fromkeys(summary["paper_category"]))
    cats = [c for c in cats if c != "All"] + (["All"] if "All" in cats else [])
    colors = dict(zip(cats, sns.color_palette("colorblind", n_colors=max(3, len(cats)))))
    if "All" in colors:
        colors["All"] = (0.15, 0.15, 0.15)
    styles = ["-", "--", "-.", ":"]
    for j, cat in enumerate(cats):
        g = summary[summary["paper_category"] == cat].sort_values("k")
        k = g["k"].to_numpy(dtype=float)
        ns = sorted(set(int(n) for n in g["n"]))
        nlab = f"n={ns[0]}" if len(ns) == 1 else f"n={ns[0]}-{ns[-1]}"
        main = cat == "All"
        ls = "-" if main else styles[j % len(styles)]
        last = j == len(cats) - 1  # the legend's "images kept" entry is this category's own artist
        if "removed_ci_low" in g and (main or "All" not in cats):  # the pooled band filled, light
            ax.fill_between(k, g["removed_ci_low"], g["removed_ci_high"], facecolor=colors[cat], alpha=0.10, lw=0,
                            label="95% Wilson CI (removed), filled" + (": all categories" if main else ""))
        elif "removed_ci_low" in g:  # a category's interval as a bar right of each k, in its colour (lines or
            y = g["accuracy_removed"].to_numpy(dtype=float)  # bands of three categories read as more series)
            ax.errorbar(k + 0.07 + 0.07 * j, y, yerr=[np.clip(y - g["removed_ci_low"], 0, None),
                                                      np.clip(g["removed_ci_high"] - y, 0, None)],
                        fmt="none", ecolor=colors[cat], elinewidth=0.7, capsize=1.2, alpha=0.9, clip_on=False,
                        label="95% Wilson CI of each category: bars right of k" if j == 0 else None)
        ax.plot(k, g["accuracy_removed"], marker="o", ls=ls, color=colors[cat], lw=1.6 if main else 1.0, ms=3,
                label=f"{cat} ({nlab})", clip_on=False)
        # the original trajectories left of k, one column per category: equal values (100 %) stay apart
        dx = -0.07 - 0.07 * (len(cats) - 1 - j) if len(cats) > 1 else -0.07
        ax.plot(k + dx, g["accuracy_original"], "D", mfc="none", mec=colors[cat], ms=2.6, mew=0.7, clip_on=False,
                ls="none", label="images kept (same pairs): hollow, left of k" if last else None)
        if len(ns) > 1:
            for xi, y, n in zip(k, g["accuracy_removed"], g["n"]):
                ax.annotate(count_label(n), (xi, y), textcoords="offset points", xytext=(0, -8), ha="center",
                            fontsize=5, color=colors[cat])
    ax.set_xlabel("k (query images removed from step k on);\nunder each k: all categories' n, McNemar p"
                  if "All" in cats else "k (query images removed from step k on)")
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(-5, 105)  # markers at 0 % and 100 % drawn whole
    set_title(ax, title, "Figure 2(c): step-k image removal")
    if len(summary):
        ks = sorted(int(k) for k in summary["k"].unique())
        pooled = summary[summary["paper_category"] == "All"].set_index("k") if "All" in cats else None
        labels = [f"{k}\nn={int(pooled.loc[k, 'n'])}\n{_p(float(pooled.loc[k, 'mcnemar_p']))}"
                  if pooled is not None and k in pooled.index else str(k) for k in ks]
        ax.set_xticks(ks, labels, fontsize=5.5 if pooled is not None else None)
        ax.set_xlim(min(ks) - 0.5, max(ks) + 0.5)
    legend_outside(ax, ncol=2)
    if own and stem is not None:
        save(fig, stem, mark)
        write_text(Path(stem).with_suffix(".md"), removal_tests_table(summary))
    return fig


def fig2b_robustness(rob, stem, *, labels: dict | None = None, title: str | None = None, mark: str | None = None):
    """ΔH per step under each aggregation of the token entropies (``rob``: analysis/robustness.py ``robustness``, its
    ``All`` rows): the paper's mean bold with its 95 % bootstrap band, the others thin, each in its own colour and
    marker; a step where an aggregation's sign differs from the paper's is ringed (beyond the paper, issue 85)."""
    sns, fig, ax, own = panel_axes(None, size=(DOUBLE / 2 + 0.6, 3.1))
    r = rob[rob["category"] == "All"]
    aggs = list(dict.fromkeys(r["aggregation"]))
    colors = dict(zip(aggs, sns.color_palette("colorblind", n_colors=max(3, len(aggs)))))
    paper = r[r["aggregation"] == "mean"].set_index("step")
    ax.axhline(0, color="0.5", lw=0.6)
    for j, a in enumerate(aggs):
        g = r[r["aggregation"] == a].sort_values("step")
        main = a == "mean"
        x = g["step"].to_numpy(dtype=float) + (0 if main else 0.04 * (j - len(aggs) / 2))
        if main:
            ax.fill_between(x, g["ci_low"], g["ci_high"], color=colors[a], alpha=0.15, lw=0)
        ax.plot(x, g["mean"], marker="os^vD<>p"[j % 8], ms=2.5 if not main else 3, lw=1.8 if main else 0.7,
                color=colors[a], label=(labels or {}).get(a, a))
        flip = [(xi, y) for xi, y, st in zip(x, g["mean"], g["step"])
                if st in paper.index and np.sign(y) != np.sign(paper.loc[st, "mean"]) and np.isfinite(y)]
        if flip:
            ax.plot(*zip(*flip), "o", mfc="none", mec="crimson", ms=6, mew=0.8,
                    label="sign differs from the paper's mean" if not ax.get_legend_handles_labels()[1].count(
                        "sign differs from the paper's mean") else None)
    ax.set_xlabel("step t (LLM call index)")
    ax.set_ylabel(DELTA_H)
    set_title(ax, title, "ΔH per step under each aggregation")
    steps_axis(ax, r["step"])
    legend_outside(ax, ncol=2)
    if stem is not None:
        save(fig, stem, mark)
    return fig


def fig2_combined(grounding_steps, entropy_summary, removal_summary, stem, *, mark: str | None = None,
                  subtitle: str | None = None, kl_summary=None):
    """Figure 2 (a)(b)(c) side by side at the width of two columns (7 in), and the KL influence as a fourth
    panel (a 2 x 2 grid) when a teacher-forced probe ran (``kl_summary``: step, kl_with_without, kl_ci_low,
    kl_ci_high, kl_n, series); a missing panel (None) is drawn as an empty, labelled axis."""
    plt, _ = pyplot()
    has_kl = kl_summary is not None and "kl_with_without" in kl_summary and \
        np.isfinite(kl_summary["kl_with_without"].astype(float)).any()
    fig, axes = subpanels(plt, 2, 2, (DOUBLE, 6.2)) if has_kl else subpanels(plt, 1, 3, (DOUBLE, 3.3))
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
                ax.title.set_text(wrap(ax.get_title().replace("\n", " "), 34))
    if subtitle:
        fig.suptitle(wrap(subtitle, 120))
    save(fig, stem, mark)
    return fig
