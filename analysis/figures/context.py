"""Figure 1 (tool calls per step), Figure 4 (accuracy by context length) and the unloading figure (ours)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from agent.lazy import lazy_module
from analysis.estimators.stats import bootstrap_ci, wilson_ci

from .style import (
    DOUBLE,
    TOOL_LABEL,
    TOOL_ORDER,
    count_label,
    halo,
    legend_outside,
    pyplot,
    save,
    set_title,
    steps_axis,
    subpanels,
    upright_counts,
    wrap,
    write_csv,
)

pd = lazy_module("pandas")  # loads on first use: a command's --help needs none of it (agent/lazy.py)


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
    Shares, not counts (the number of tool calls behind each bar is printed above it), over steps 1..max_step;
    the step axis ends at the last step that has data.
    """
    plt, sns = pyplot()
    shares, counts = tool_shares(calls, max_step)
    totals = counts.sum(axis=1)
    write_csv(shares, Path(stem).with_suffix(".csv"))  # the plotted numbers, beside the figure
    fig, ax = plt.subplots(figsize=(DOUBLE, 2.5), layout="constrained")
    bottom = np.zeros(len(shares))
    colors = sns.color_palette("colorblind", n_colors=max(3, shares.shape[1]))
    for j, tool in enumerate(shares.columns):
        ax.bar(shares.index, shares[tool].to_numpy(), bottom=bottom, label=TOOL_LABEL.get(tool, tool), color=colors[j],
               width=0.8)
        bottom += shares[tool].to_numpy()
    for x, n in totals.items():
        ax.text(x, 101.5, count_label(n), ha="center", va="bottom", fontsize=5.5, color="0.35",
                rotation=upright_counts(len(totals)))
    ax.set_xlabel("step t (LLM call index)")
    ax.set_ylabel("share of tool calls (%)")
    ax.set_ylim(0, 110)
    ax.set_yticks(range(0, 101, 20))
    steps_axis(ax, shares.index)  # the axis ends at the last step with a tool call
    if shares.shape[1]:
        legend_outside(ax, ncol=3)
    else:
        ax.text(0.5, 0.5, "no tool calls in these trajectories", ha="center", va="center", transform=ax.transAxes)
    set_title(ax, title, "Figure 1: tool calls by type per step (numbers: tool calls at that step)", 110)
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
    (a) every trajectory (light points) and the mean per length bin drawn across the lengths the bin covers, with its
    95% bootstrap CI shaded over the same span; (b) the accuracy per bin with its 95% Wilson band and the n behind each point.
    The binned numbers are written beside the figure (``stem.csv``). One model's trajectories per call: the
    caller decides what to pool (analysis.report never pools different model mixes).
    """
    plt, sns = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(DOUBLE, 2.9), layout="constrained")
    methods = list(dict.fromkeys(samples["method"]))
    colors = dict(zip(methods, sns.color_palette("colorblind", n_colors=max(3, len(methods)))))
    tab = context_bins(samples, bins)
    labels = tab.attrs["labels"]
    rng = np.random.default_rng(0)
    off = 0.08 * (len(methods) - 1)
    right = min(bins[-1] - 1, int(samples["n_calls"].max()))  # the axis ends at the longest trajectory
    for j, (m, g) in enumerate(samples.groupby("method", sort=False)):
        jitter = rng.uniform(-0.25, 0.25, len(g))
        # the points fade as they multiply (thousands at paper scale), so that the bins' means stay readable on them
        a.scatter(g["n_calls"] + jitter, g["max_prompt_tokens"], s=3, alpha=float(np.clip(150 / len(g), 0.04, 0.25)),
                  color=colors[m], linewidths=0, zorder=1)
        t = tab[tab["method"] == m]
        # each bin's mean over the lengths it covers (a point at the bin's mean length would sit where no
        # trajectory need be), its 95% bootstrap CI shaded over the same span
        for i, (lo, hi, y, clo, chi) in enumerate(zip(t["bin_index"].map(lambda i: bins[i]),
                                                      t["bin_index"].map(lambda i: bins[i + 1]), t["working_context"],
                                                      t["wc_ci_low"], t["wc_ci_high"])):
            span = [lo - 0.45, min(hi - 1, right) + 0.45]  # across the bin's lengths, within the axis
            a.fill_between(span, clo if np.isfinite(clo) else y, chi if np.isfinite(chi) else y, color=colors[m],
                           alpha=0.15, lw=0)
            a.plot(span, [y, y], "-", lw=1.6, color=colors[m], label=m if i == 0 else None, zorder=3,
                   path_effects=halo(3.2))
        x = t["bin_index"].to_numpy(dtype=float) + (-off / 2 + 0.08 * j if len(methods) > 1 else 0)
        b.fill_between(x, t["acc_ci_low"], t["acc_ci_high"], color=colors[m], alpha=0.12, lw=0)
        b.plot(x, t["accuracy"], "o-", ms=3, lw=1.1, color=colors[m], label=m)
        for xi, y, c in zip(x, t["accuracy"], t["n"]):
            # the first method's counts above its points, the second's below: two methods' counts never overlap
            b.annotate(count_label(c), (xi, y), textcoords="offset points", xytext=(0, 3 if j % 2 == 0 else -4),
                       va="bottom" if j % 2 == 0 else "top", ha="center", fontsize=5, color=colors[m])
    a.set_xticks(range(bins[0], right + 1, max(1, (right - bins[0]) // 10)))
    a.set_xlim(bins[0] - 0.6, right + 0.6)
    a.set_xlabel("trajectory length (LLM calls); dots: trajectories")
    a.set_ylabel("working context (max prompt tokens)")
    a.set_title(f"(a) working context: mean per length bin ({', '.join(labels[:3])}, ...), 95% CI shaded",
                fontsize=7)
    b.set_xticks(range(len(labels)), labels)
    b.set_xlabel("trajectory length (LLM calls); n by each point (the first method's above, the second's below)")
    b.set_ylabel("accuracy (%)")
    b.set_ylim(-3, 108)
    b.set_title("(b) accuracy vs trajectory length (95% Wilson band)")
    legend_outside(b, ncol=min(4, len(methods)))  # one legend: both panels draw the same methods
    fig.suptitle(wrap(title or "Figure 4", 120))
    write_csv(tab, Path(stem).with_suffix(".csv"), index=False)
    save(fig, stem, mark)
    return fig


def fig_unload(points, steps, stem, *, mark: str | None = None, subtitle: str | None = None, hist_policy=None):
    """The adaptive image unloading (ours): (a) accuracy against query-image steps kept — ReAct with the images
    kept, each fixed Removal@k, each adaptive policy (ε, M): the Pareto picture; (b) when the detector unloaded
    the images, per paper category (one adaptive policy: ``hist_policy``, default the calibrated one)."""
    plt, sns = pyplot()
    fig, (ax, bx) = subpanels(plt, 1, 2, (DOUBLE, 3.8))
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
    ax.set_xlabel(wrap("query-image steps kept per trajectory (query images in context, summed over its calls)", 60))
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(-3, 108)
    ax.set_yticks(range(0, 101, 20))
    ax.set_xlim(left=-0.2)
    ax.set_title("(a) accuracy vs. images kept in context")
    legend_outside(ax)
    if steps is None or not len(steps):
        bx.text(0.5, 0.5, "(b) no adaptive run", ha="center", va="center", transform=bx.transAxes)
        bx.set_axis_off()
    else:
        pol = hist_policy or (steps[steps["calibrated"]]["policy"].iloc[0] if steps["calibrated"].any()
                              else steps["policy"].iloc[0])
        d = steps[steps["policy"] == pol]
        never = int(np.nanmax(d["n_calls"].astype(float))) + 1 if len(d) else 1
        d = d.assign(bin=d["unload_step"].fillna(never).astype(int))
        cats = [c for c in dict.fromkeys(d["paper_category"]) if c is not None]
        bins = list(range(int(min(d["bin"].min(), 2)), never + 1))
        colors = dict(zip(cats, sns.color_palette("colorblind", n_colors=max(3, len(cats)))))
        w = 0.8 / max(1, len(cats))
        for j, cat in enumerate(cats):
            dc = d[d["paper_category"] == cat]
            share = [100.0 * float((dc["bin"] == b).mean()) for b in bins]
            xs = np.arange(len(bins)) + (j - (len(cats) - 1) / 2) * w
            med = dc["unload_step"].median()
            bx.bar(xs, share, width=w, color=colors[cat],
                   label=f"{cat} (n={len(dc)}; median {med:g})" if np.isfinite(med) else f"{cat} (n={len(dc)}; never)")
        bx.set_xticks(np.arange(len(bins)), [str(b) if b != never else "never" for b in bins])
        bx.set_xlabel("unload step (first step without the query images)")
        bx.set_ylabel("share of the category's trajectories (%)")
        bx.set_ylim(0, 103)
        bx.set_title(wrap(f"(b) unload steps by category: {pol}", 50))
        legend_outside(bx)
    if subtitle:
        fig.suptitle(wrap(subtitle, 120))
    save(fig, stem, mark)
    return fig
