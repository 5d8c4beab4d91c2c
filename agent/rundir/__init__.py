"""A run directory: header first, one JSONL line per finished (sample, trial), columnar token sidecars.

One module per concern: ``common`` (the error, identity keys, atomic writes, locks), ``writer``
(:class:`RunDir`: header, run lock, append, images), ``index`` (``results.index.jsonl``, verified by
checksum), ``reader`` (:class:`Run`, :func:`load_run`), ``check`` (``python -m agent.rundir check``).

    RUN/header.json          arguments, versions, backend, tools; written first (identity checked on resume)
    RUN/results.jsonl        one line per finished (sample, trial); a line is appended only when complete
    RUN/tokens/<key>.parquet per-token arrays of that line's LLM calls (written before the line)
    RUN/images/<sha256>.<ext> each query image once, by content hash
    RUN/tools.sqlite         the tool cache (record/replay), unless --tool-cache points elsewhere

Reading (a notebook can do the same):

    from agent.rundir import load_run
    run = load_run("runs/demo")
    frames.results(run)    # pandas, one row per (sample, trial)   (agent.rundir.frames)
    frames.steps(run)      # pandas, one row per LLM call
    run.tokens(line)       # dict of numpy arrays for that line (call, id, logprob, think, top_logprobs, …)
    run.call_messages(line, call_event)   # the exact messages of that call (images as sha256 parts)

A line for the same (sample, trial) written later (``--retry-errors``) supersedes the earlier one.
A torn last line (a crash mid-write) is reported and ignored; the pair is rerun on resume.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

__all__ = ["RunDir", "Run", "load_run", "RunError", "IDENTITY_KEYS", "versions", "token_key", "read_parquet",
           "TOKEN_PRECISIONS", "RESUME_HISTORY", "Lines", "summary_of", "check_run", "CheckReport", "close_fragment",
           "output_lock", "write_json", "main", "UNLOAD_COLUMNS"]

# loaded when first read: ``python -m agent.rundir --help`` imports this package and needs none of the work
__getattr__, __dir__ = lazy_exports(__name__, {
    "CheckReport": ".check", "check_run": ".check", "main": ".cli",
    **{n: ".common" for n in ("IDENTITY_KEYS", "RESUME_HISTORY", "TOKEN_PRECISIONS", "RunError", "close_fragment",
                              "output_lock", "token_key", "versions", "write_json")},
    "Lines": ".index", "summary_of": ".index", "Run": ".reader", "load_run": ".reader",
    "UNLOAD_COLUMNS": ".sidecar", "read_parquet": ".sidecar", "RunDir": ".writer"})

if TYPE_CHECKING:
    from .check import CheckReport, check_run
    from .cli import main
    from .common import (
        IDENTITY_KEYS,
        RESUME_HISTORY,
        TOKEN_PRECISIONS,
        RunError,
        close_fragment,
        output_lock,
        token_key,
        versions,
        write_json,
    )
    from .index import Lines, summary_of
    from .reader import Run, load_run
    from .sidecar import UNLOAD_COLUMNS, read_parquet
    from .writer import RunDir
