"""The probes' outputs, read back: the one reader of what the probes write beside a run (records layer).

    rows = read_rows(run / "probes" / "entropy-regenerate" / "steps.jsonl", "entropy_step")
    d = probe_dir(run, ("removal",), "probes.removal")          # a run's default output, or a probe's --out
    table = read_table(d, ("outcomes",))                          # its Parquet (or CSV) table

A probe appends one JSON line per finished step or trajectory (``steps.jsonl``, ``labels.jsonl``), each a record
of its model (agent/record/probes.py), and writes its tables when a session ends. :func:`read_rows` reads such a
file the one way every reader does: line by line as bytes (a line a kill cut, even inside a multi-byte character,
is one bad line, never a crash), each line a valid record of its kind, sealed as a result line is and naming the seal
of the line it was computed from (``source_sha256``), or left out (and counted). The viewer, the
frames of ``analysis.frames`` and the probes' own resume read through here; nobody reads a probe's file by name
elsewhere.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from ..lazy import lazy_module
from ..record import SchemaError, validate
from .common import RunError
from .grades import sources_of
from .lines import SOURCE_KEY, read_sealed, set_aside

if TYPE_CHECKING:  # the types mypy checks against
    import pandas as pd
else:
    pd = lazy_module("pandas")  # loads on first use: a command's --help needs none of it (agent/lazy.py)

log = logging.getLogger(__name__)

__all__ = ["NoProbeOutput", "probe_dir", "read_rows", "resume_rows", "check_sources", "read_table", "PROBE_OUTPUTS"]

#: Each probe's output directory under ``RUN/probes/``, its row file and the record kind of a row.
PROBE_OUTPUTS = {"entropy-regenerate": ("steps.jsonl", "entropy_step"),
                 "entropy-teacher-forced": ("steps.jsonl", "entropy_step"),
                 "grounding": ("labels.jsonl", "grounding_label")}


class NoProbeOutput(RunError):
    """The probe has not been run (or has not finished a step) there: a panel to list as missing, not an error."""


def probe_dir(path, names: tuple[str, ...], command: str) -> Path:
    """The probe's output directory: ``path/probes/<name>`` for a run directory (the first of ``names`` there), or
    ``path`` itself (the probe's ``--out``). :class:`NoProbeOutput` when the run has none."""
    p = Path(path)
    if (p / "header.json").is_file():  # a run directory: the probe's default output
        for name in names:
            if (p / "probes" / name).is_dir():
                return p / "probes" / name
        raise NoProbeOutput(f"{p}: no output of {command} (looked in "
                            f"{', '.join(str(p / 'probes' / n) for n in names)}); run python -m {command} {p} first")
    if not p.is_dir():
        raise RunError(f"{p}: no such directory (a run directory or the --out of python -m {command})")
    return p


def read_rows(path, kind: str, sources: dict | None = None) -> tuple[list[dict], int]:
    """``(rows, left_out)``: the valid ``kind`` records of a probe's JSONL file in file order (none when it does not
    exist), and how many lines were left out: torn, changed since written (their seal does not match), not a valid
    record, or (with ``sources``, {(sample, trial): the seal of the run's line}) computed from a line the run does
    not hold now."""
    sealed = read_sealed(path)
    rows, bad = [], len(sealed.changed) + len(sealed.torn)
    for row in sealed.rows:
        row.pop("_lineno")
        try:
            validate(kind, row, str(path))
        except SchemaError:
            bad += 1
            continue
        if sources is not None and row.get(SOURCE_KEY) != sources.get((row["sample_id"], row["trial"])):
            bad += 1
            continue
        rows.append(row)
    return rows, bad


def resume_rows(path, kind: str, sources: dict) -> list[dict]:
    """The rows a probe resumes from: those changed since written or torn are set aside into ``quarantine/`` beside
    the file (warned, naming it) and redone, like rows computed from a line the run no longer holds."""
    sealed = read_sealed(path)
    problem = sealed.problem()
    if problem:
        log.warning(f"warning: {problem}: set aside in {set_aside(sealed)}; those rows are computed again")
    return read_rows(path, kind, sources)[0]


def check_sources(df: pd.DataFrame, out, what: str, command: str) -> pd.DataFrame:
    """A probe's table read through a run directory: refused when any row was computed from a line the run does not
    hold now (changed or replaced since the probe ran), naming how many and the rerun that computes them again."""
    p = Path(out)
    if not (p / "header.json").is_file() or SOURCE_KEY not in df:
        return df
    sources = {f"{k[0]}\x00{k[1]}": h for k, h in sources_of(p).items()}
    keys = df["sample_id"].astype(str) + "\x00" + df["trial"].astype(str)
    stale = (keys.map(sources) != df[SOURCE_KEY]).to_numpy()
    if stale.any():
        raise RunError(f"{what}: {int(stale.sum())} of {len(df)} row(s) were computed from result lines {p} no longer "
                       f"holds (changed or rerun since); python -m {command} {p} computes them again")
    return df


def read_table(d: Path, stems: tuple[str, ...]) -> pd.DataFrame:
    """The probe's table ``<stem>.parquet`` (else ``.csv``) in ``d``, the first of ``stems`` that exists."""
    for stem in stems:
        for ext in (".parquet", ".csv"):
            f = d / f"{stem}{ext}"
            if f.is_file():
                try:
                    return pd.read_parquet(f) if ext == ".parquet" else pd.read_csv(f)
                except (OSError, ValueError) as e:
                    raise RunError(f"{f}: unreadable ({e})") from None
    raise NoProbeOutput(f"{d}: no {' or '.join(s + '.parquet/.csv' for s in stems)} (the probe has not finished a step)")
