"""The resumable runner: a method over a benchmark, N trials, recorded into a run directory.

    python -m agent.run --method react --out runs/demo-react              # embedded default: tiny model, offline world, demo
    python -m agent.run --method mmcontextfold --benchmark data/mmsearch --backend sglang \\
        --endpoint http://gpu:30000 --endpoint http://gpu:30001 --model-dir /models/Qwen3.5-27B \\
        --tools live --trials 3 --concurrency 64 --out runs/mmsearch-cf-27b

asyncio workers (``--concurrency``) share the backends (one per ``--endpoint``; each trajectory stays
on one endpoint so the server's prefix cache is reused; the least busy endpoint gets the next one).
A rerun of the same command skips the (sample, trial) pairs already written; ``--retry-errors``
reruns the ones that ended in ``error`` or ``timeout``. Ctrl-C stops cleanly: every finished pair is
on disk; each one in flight continues from its last completed call next time (``agent/run/journal.py``:
every completed call of an unfinished unit is recorded in ``RUN/inflight/``). ``--timeout`` bounds one sample.
See ``agent/rundir/`` and ``docs/trajectory.md`` for what is written.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

__all__ = ["RunConfig", "run", "main", "EMBEDDED_MAX_TOKENS", "SERVED_MAX_TOKENS", "trial_seeds", "PROCESS_CONCURRENCY",
           "auto_processes", "header_for", "make_backends", "identify_backends", "build_parser", "config_from_args",
           "UnitStats"]

# loaded when first read: ``python -m agent.run --help`` imports this package and needs none of the work
__getattr__, __dir__ = lazy_exports(__name__, {
    "build_parser": ".cli", "main": ".cli", "config_from_args": ".command",
    "EMBEDDED_MAX_TOKENS": "..choices", "PROCESS_CONCURRENCY": "..choices", "SERVED_MAX_TOKENS": "..choices",
    "RunConfig": ".config", "auto_processes": ".config", "header_for": ".config", "make_backends": ".config",
    "trial_seeds": ".config", "UnitStats": ".execute", "identify_backends": ".runner", "run": ".runner"})

if TYPE_CHECKING:
    from ..choices import EMBEDDED_MAX_TOKENS, PROCESS_CONCURRENCY, SERVED_MAX_TOKENS
    from .cli import build_parser, main
    from .command import config_from_args
    from .config import RunConfig, auto_processes, header_for, make_backends, trial_seeds
    from .execute import UnitStats
    from .runner import identify_backends, run
