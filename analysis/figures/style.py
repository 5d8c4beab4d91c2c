"""How every figure looks and is saved: paper sizes, panels, legends below the axes, integer step ticks, the
provenance mark of a figure made from a fake or random model, and PNG + PDF output.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import textwrap
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from agent.record import RunHeader

GROUNDING = ["Image Needed", "Image-Derived", "Text Only"]


TOOL_ORDER = ["lens_search", "search", "visit"]


TOOL_LABEL = {"lens_search": "Visual Search (lens)", "search": "Text Retrieval (search)", "visit": "Web Visit"}


DELTA_H = r"$\Delta H_t = H(\tau_t) - H(\tau_t^{\mathrm{IR}})$"


#: Paper sizes (in): one column, two columns (ours: the common two-column templates' widths).
COLUMN, DOUBLE = 3.3, 7.0


def pyplot():
    """(pyplot, seaborn), themed for the paper. Imported here, on the first figure, not with the module: matplotlib
    and seaborn are ~0.4 s of every command's start otherwise, ``--help`` included (ours, issue 59)."""
    import matplotlib
    import matplotlib.pyplot as plt
    import seaborn as sns

    matplotlib.use("Agg")

    sns.set_theme(style="whitegrid", palette="colorblind", context="paper")
    plt.rcParams.update({"font.size": 7, "axes.titlesize": 7.5, "axes.labelsize": 7, "xtick.labelsize": 6,
                         "ytick.labelsize": 6, "legend.fontsize": 6, "figure.titlesize": 8, "lines.markersize": 3.5,
                         "axes.titlepad": 4})
    return plt, sns


def wrap(title: str, width: int) -> str:
    return "\n".join(textwrap.wrap(title, width)) if len(title) > width else title


def panel_axes(ax, size=(COLUMN, 2.9)):
    """(seaborn, figure, axis, own): a new figure unless the caller passes the axis to draw into (an axis of
    its own subfigure, so that the panel's legend goes under the panel: :func:`legend_outside`)."""
    plt, sns = pyplot()
    if ax is None:
        fig = plt.figure(figsize=size, layout="constrained")
        return sns, fig, fig.subplots(), True
    return sns, ax.figure, ax, False


def subpanels(plt, n_rows: int, n_cols: int, size):
    """A constrained figure of ``n_rows x n_cols`` subfigures with one axis each: every panel keeps its own
    legend below it, sized by the layout (never over a neighbour or the data)."""
    fig = plt.figure(figsize=size, layout="constrained")
    subs = np.atleast_1d(fig.subfigures(n_rows, n_cols, wspace=0.02, hspace=0.02)).ravel()
    return fig, [sf.subplots() for sf in subs]


def provenance_mark(headers: Iterable[RunHeader]) -> str | None:
    """The stamp a figure gets when any of its runs came from a model whose numbers mean nothing."""
    marks = []
    for h in headers:
        if h.backend.kind == "scripted":
            marks.append("SCRIPTED FAKE BACKEND: planted numbers, not a result")
        elif h.backend.embedded_tiny_model:
            marks.append("RANDOM WEIGHTS (embedded tiny model): meaningless numbers")
    return " | ".join(dict.fromkeys(marks)) or None


@contextlib.contextmanager
def written(path):
    """A temporary sibling of ``path`` (same suffix) to write to, renamed onto ``path`` when the block ends: a
    report killed mid-way leaves each output as it was before or as it is now, never empty or half-written."""
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.tmp{os.getpid()}{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_csv(df, path, **kw) -> None:
    """``df.to_csv(path)``, written under a temporary name and renamed into place (:func:`written`)."""
    with written(path) as tmp:
        df.to_csv(tmp, **kw)


def write_text(path, text: str) -> None:
    with written(path) as tmp:
        tmp.write_text(text)


def save(fig, stem, mark: str | None = None) -> list[Path]:
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    if mark:
        # above everything (the legends sit at the bottom); the tight bounding box keeps it in the file
        fig.text(0.5, 1.0, mark, ha="center", va="bottom", fontsize=6.5, color="#b00020", weight="bold",
                 transform=fig.transFigure)
    paths = [stem.with_suffix(".png"), stem.with_suffix(".pdf")]
    with written(paths[0]) as tmp:
        fig.savefig(tmp, dpi=200, bbox_inches="tight")
    with written(paths[1]) as tmp:
        fig.savefig(tmp, bbox_inches="tight")

    import matplotlib.pyplot as plt  # loaded by the figure's pyplot() already: a lookup

    plt.close(fig)  # a report draws dozens of figures: release each once written
    return paths


def _part(x) -> bytes:
    """One input of a figure as bytes (a DataFrame as its CSV, anything else as its repr)."""
    if hasattr(x, "to_csv"):
        return x.to_csv(index=False).encode()
    return repr(x).encode()


_CODE: list = []


def _code_digest() -> str:
    """The figure code's own bytes (this package): a figure drawn by other code is drawn again."""
    if not _CODE:
        h = hashlib.sha256()
        for f in sorted(Path(__file__).parent.glob("*.py")):
            h.update(f.read_bytes())
        _CODE.append(h.hexdigest())
    return _CODE[0]


def draw(fn, args: tuple, stem, **kw):
    """``fn(*args, stem, **kw)`` unless ``stem``'s PNG and PDF were drawn from exactly these inputs by this code (their
    digest is kept in ``stem.inputs``): a report run again with nothing changed draws nothing again. Returns what
    ``fn`` returns, or None when nothing was drawn."""
    stem = Path(stem)
    h = hashlib.sha256(_code_digest().encode())
    for x in args:
        h.update(_part(x) + b"\0")
    for k in sorted(kw):
        h.update(k.encode() + b"=" + _part(kw[k]) + b"\0")
    digest, record = h.hexdigest(), stem.with_suffix(".inputs")
    if all(stem.with_suffix(e).is_file() for e in (".png", ".pdf")) and record.is_file() and \
            record.read_text().strip() == digest:
        return None
    out = fn(*args, stem, **kw)
    write_text(record, digest + "\n")
    return out


def count_label(n: int) -> str:
    """A count short enough to stand above a bar: 950, 1.7k, 12k."""
    n = int(n)
    return str(n) if n < 1000 else f"{n / 1000:.1f}k" if n < 10_000 else f"{n / 1000:.0f}k"


def halo(width: float) -> list:
    """A white outline of ``width`` points around a line, so that it reads on top of many points."""
    from matplotlib.patheffects import withStroke

    return [withStroke(linewidth=width, foreground="white")]


def upright_counts(n_labels: int) -> int:
    """The rotation of the counts above a row of bars or points: upright beyond 10 of them, where neighbours would
    run together at a paper's column width."""
    return 0 if n_labels <= 10 else 90


def legend_outside(ax, ncol: int | None = None, **kw):
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


def set_title(ax, title, default, width: int = 52):
    ax.set_title(wrap(title or default, width))


def steps_axis(ax, steps, max_step=None):
    steps = sorted(int(s) for s in steps)
    if not steps:
        return
    hi = max_step or max(steps)
    stride = 1 if hi <= 20 else 2
    ax.set_xticks(range(1, hi + 1, stride))
    ax.set_xlim(0.4, hi + 0.6)
