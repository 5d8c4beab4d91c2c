"""``python -m agent.show``: the viewer's command line (the sample list, one trajectory, or the HTML pages). The
viewer's modules load once the arguments parse: ``--help`` and a usage error need the standard library only."""
from __future__ import annotations

import logging
from pathlib import Path

from ..choices import AUTO_TOKENS
from ..cli import done, make_parser, positive_int, printable
from ..lazy import lazy_module
from . import __doc__ as SHOW_DOC

pd = lazy_module("pandas")  # loads on first use (agent/lazy.py)

log = logging.getLogger(__name__)


def main(argv=None) -> int:
    ap = make_parser("python -m agent.show", SHOW_DOC, [
        "python -m agent.show runs/demo-react",
        "python -m agent.show runs/demo-react demo_3 --reasoning",
        "python -m agent.show runs/demo-react --html         # writes runs/demo-react/run.html"])
    ap.add_argument("run_dir", help="a run directory")
    ap.add_argument("sample_id", nargs="?", help="one trajectory (none: the list of samples)")
    ap.add_argument("--trial", type=int, default=0, help="which trial of the sample")
    ap.add_argument("--reasoning", action="store_true", help="show each call's whole reasoning (default: its first line)")
    ap.add_argument("--observation-chars", type=int, default=400, help="observations are cut at this length")
    ap.add_argument("--html", metavar="OUT.html", nargs="?", const="",
                    help="write the run as HTML: OUT.html (the index: paging and search) and OUT_files/ (one page per "
                         "trajectory); without OUT.html, RUN_DIR/run.html")
    ap.add_argument("--limit", type=positive_int, help="HTML: the first N trajectories only")
    ap.add_argument("--tokens", choices=("auto", "all", "none"), default="auto",
                    help=f"HTML: embed each call's think tokens, coloured by H / ΔH / KL (auto: when at most "
                         f"{AUTO_TOKENS} trajectories are written; they dominate the page's size)")
    return _show(ap.parse_args(argv))


def _show(a) -> int:
    # the work loads once the arguments parse
    from ..rundir import RunError, load_run  # noqa: PLC0415
    from .data import sample_table  # noqa: PLC0415
    from .html import build_html  # noqa: PLC0415
    from .text import render_text  # noqa: PLC0415

    try:
        if a.html is not None:  # reads the run itself, keeping a few hundred bytes a trajectory of its index
            info = build_html(a.run_dir, a.html or Path(a.run_dir) / "run.html", limit=a.limit,
                              sample_ids=[a.sample_id] if a.sample_id else None, tokens=a.tokens)
            print(f"{info['samples']} trajectories, {info['images']} images, {info['bytes'] / 1e6:.1f} MB: the index "
                  f"{info['index_bytes'] / 1e3:.0f} KB, one page per trajectory in {info['files']} (largest "
                  f"{info['largest_page_bytes'] / 1e3:.0f} KB)"
                  + ("" if info["tokens"] else "; think tokens not embedded (--tokens all, or fewer trajectories "
                     "with --limit / a SAMPLE_ID, colours them)"))
            if info["missing_images"]:
                log.warning(f"warning: {len(info['missing_images'])} images are not stored in {a.run_dir}/images")
            done([info["path"]], f"open it in a browser (file://{Path(info['path']).resolve()})")
            return 0
        run = load_run(a.run_dir)
        if not a.sample_id:
            df = sample_table(run)
            if df.empty:
                print(f"{run.path}: no finished trajectory yet")
                return 0

            with pd.option_context("display.max_rows", 500, "display.max_colwidth", 40, "display.width", 160):
                print(printable(df.to_string(index=False)))
            print(f"\n{len(df)} trajectories; judge: {df.attrs.get('judge') or 'none yet'}")
            done([], f"python -m agent.show {a.run_dir} {df.iloc[0]['sample_id']}   |   "
                     f"python -m agent.show {a.run_dir} --html")
            return 0
        line = next((ln for ln in run.index if ln.key == (a.sample_id, a.trial)), None)
        if line is None:
            log.error(f"error: {run.path}: no trajectory {a.sample_id} trial {a.trial}")
            return 2
        print(printable(render_text(run, run.full(line), reasoning=a.reasoning,
                                    observation_chars=a.observation_chars)))
        return 0
    except RunError as e:
        log.error(f"error: {e}")
        return 2
    except OSError as e:
        if isinstance(e, BrokenPipeError) or a.html is None:
            raise
        # the page's place cannot be written (under a regular file, read-only, full)
        log.error(f"error: {e.filename or a.html}: cannot write the page ({e.strerror or e})")
        return 2
