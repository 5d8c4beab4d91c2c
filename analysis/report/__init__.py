"""Every figure and table the runs and probes allow, in one command.

    python -m analysis.report --react runs/react-9b runs/react-27b runs/react-35b \
        --runs runs/direct-* runs/react-* runs/mmcf-* --removal-runs runs/react-27b runs/react-rm1 runs/react-rm3 \
        [--judge llm|exact] [--out figures/out]

- ``--react RUN ...``: probed ReAct runs (``probes.grounding``, ``probes.entropy``, ``probes.removal``).
  Figure 1 (tool-call shares per step) and Figure 2 (a)(b)(c) pool them, as the paper pools its three
  backbones; panel (b) also draws each run's own curve. Written as one figure and as separate panels.
- ``--runs RUN ...``: judged runs, one per method x backbone x benchmark: Table 1 (accuracy: one row per
  method and backbone, one column per benchmark), Table 4 (per method, pooled over its runs), Table 5
  (MMSearch-Plus by number of images), Figure 4.
  HLE-VL runs among them make Table 13 (D.1: means over trials) and enter no other table.
- ``--removal-runs RUN ...``: judged ReAct and ReAct-Removal@k runs: Table 3.

One judge per table (``--judge`` picks one when runs were graded differently). What cannot be made (a
probe not run, a run not judged) is listed, not faked. Output: ``--out`` (default ``figures/out``), PNG +
PDF figures and Markdown + CSV tables. Exit status 2 when a table would mix judges.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from agent.lazy import lazy_exports

__all__ = ['main', 'make_report']

# loaded when first read: ``python -m analysis.report --help`` imports this package and needs none of the work
__getattr__, __dir__ = lazy_exports(__name__, {
    "make_report": ".make",
    "main": ".cli"})

if TYPE_CHECKING:
    from .cli import main
    from .make import make_report
