"""Look at a run: a trajectory in the terminal, or the whole run as self-contained HTML pages.

    python -m agent.show RUN_DIR                                  # the samples: status, answer, gold, grade
    python -m agent.show RUN_DIR demo_3 [--trial 0] [--reasoning] # one trajectory, call by call
    python -m agent.show RUN_DIR --html [OUT.html] [--limit N]    # HTML (no server, no network): RUN_DIR/run.html
                                                                  # (the index) and run_files/: a page per trajectory

The terminal view prints each LLM call with its state and branch span, the images it saw (query and
retrieved, by hash), its reasoning (first line, unless ``--reasoning``), its visible text, the parsed
action or why it was rejected, the tool calls with their observations, folds, branch spans and the budget
used. The HTML page lists the samples (filter by status, grade, benchmark, id) and, per sample, the event
timeline with main and branch spans nested; each call shows its exact messages with image thumbnails (the
images that call saw, embedded once per page; those over :data:`EMBED_PX` pixels on a side downscaled, the
originals being in ``RUN/images/``), its tool calls and observations (collapsible), and its
think tokens coloured by their grouped-tail entropy — or, where the entropy probe ran teacher-forced on this
run, by ΔH and by the KL(with ‖ without) influence of the images (the step's ΔH is shown for either mode).
The index page holds the run at a glance and the trajectories in pages of 100, with filters and a search over
all of them (the list is read from ``run_files/list-<i>.js`` as it is needed); each trajectory is a page of
its own (its data gzip-compressed, rendered when opened) with links back to the index and to its neighbours.
No page lists every trajectory: each page's size and the writer's memory stay the same as the run grows.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

__all__ = ["main", "run_summary", "sample_table", "build_html", "files_dir", "LIST_CHUNK", "render_text"]

# loaded when first read: ``python -m agent.show --help`` imports this package and needs none of the work
__getattr__, __dir__ = lazy_exports(__name__, {
    "main": ".cli", "run_summary": ".data", "sample_table": ".data", "build_html": ".html", "files_dir": ".html",
    "LIST_CHUNK": ".html", "render_text": ".text"})

if TYPE_CHECKING:
    from .cli import main
    from .data import run_summary, sample_table
    from .html import LIST_CHUNK, build_html, files_dir
    from .text import render_text
