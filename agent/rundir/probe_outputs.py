"""The probes' outputs, read back: the one reader of what the probes write beside a run (records layer).

    rows = read_rows(run / "probes" / "entropy-regenerate" / "steps.jsonl", EntropyStep)   # [EntropyStep]
    d = probe_dir(run, ("removal",), "probes.removal")          # a run's default output, or a probe's --out
    table = read_table(d, ("outcomes",))                          # its Parquet (or CSV) table

A probe appends one JSON line per finished step or trajectory (``steps.jsonl``, ``labels.jsonl``), each a record
of its model (agent/record/probes.py), and writes its tables when a session ends (:func:`write_outputs`), then
``seals.json`` last: each table's sha256, each per-token file's, and the sha256 of the rows file the tables were
computed from. :func:`read_table` and :func:`verify_output` read a table or a per-token file only as sealed: one
edited since (a ΔH in steps.parquet, a grade in outcomes.csv), a rows file changed since its tables were written, or
an output without seals is refused, naming the file and the rerun that writes it again. :func:`read_rows` reads such a
file the one way every reader does: line by line as bytes (a line a kill cut, even inside a multi-byte character,
is one bad line, never a crash), each line a valid record of its kind, sealed as a result line is and naming the seal
of the line it was computed from (``source_sha256``), or left out (and counted). The viewer, the
frames of ``agent.rundir.frames`` and the probes' own resume read through here; nobody reads a probe's file by name
elsewhere.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, TypeVar

from ..lazy import lazy_module
from ..paths import NotAFile, file_sha256
from ..record import SCHEMAS, EntropyStep, GroundingLabel, SchemaError, validate
from ..record.base import Derived
from .common import RunError, atomic_write, stale_temporaries
from .grades import sources_of
from .lines import SOURCE_KEY, SealedRows, iter_sealed, read_sealed, set_aside

if TYPE_CHECKING:  # the types mypy checks against
    import pandas as pd
else:
    pd = lazy_module("pandas")  # loads on first use: a command's --help needs none of it (agent/lazy.py)

log = logging.getLogger(__name__)
R = TypeVar("R", bound=Derived)

__all__ = ["NoProbeOutput", "probe_dir", "read_rows", "resume_rows", "check_sources", "read_table", "PROBE_OUTPUTS",
           "SEALS", "write_outputs", "verify_output", "seal_problems", "PROBE_COMMANDS", "sweep_outputs"]

#: The seals of a probe's output directory, written after its tables (its presence: they are complete).
SEALS = "seals.json"
#: The command that writes each probe's outputs (named in every refusal: rerunning it writes them again).
PROBE_COMMANDS = {"entropy-regenerate": "probes.entropy", "entropy-teacher-forced": "probes.entropy --mode teacher-forced",
                  "grounding": "probes.grounding", "removal": "probes.removal"}

#: Each probe's output directory under ``RUN/probes/``, its row file and the model of a row.
PROBE_OUTPUTS: dict[str, tuple[str, type[Derived]]] = {"entropy-regenerate": ("steps.jsonl", EntropyStep),
                                                     "entropy-teacher-forced": ("steps.jsonl", EntropyStep),
                                                     "grounding": ("labels.jsonl", GroundingLabel)}


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


def read_rows(path, model: type[R], sources: dict | None = None) -> tuple[list[R], int]:
    """``(rows, left_out)``: the valid records of a probe's JSONL file as ``model`` (agent/record/probes.py) in file
    order (none when it does not exist), and how many lines were left out: torn, changed since written (their seal
    does not match), not a valid record, or (with ``sources``, {(sample, trial): the seal of the run's line})
    computed from a line the run does not hold now."""
    tally = SealedRows(Path(path))
    rows = list(iter_rows(tally, model, sources))
    return rows, tally.left_out


def iter_rows(tally: SealedRows, model: type[R], sources: dict | None = None) -> Iterator[R]:
    """:func:`read_rows`' rows one at a time, as the file is read (:func:`agent.rundir.lines.iter_sealed`); those
    left out are counted in ``tally.left_out``."""
    kind = kind_of(model)
    for raw in iter_sealed(tally):
        raw.pop("_lineno")
        try:
            row = validate(kind, raw, str(tally.path))
        except SchemaError:
            tally.left_out += 1
            continue
        if sources is not None and row.source_sha256 != sources.get((row.sample_id, row.trial)):
            tally.left_out += 1
            continue
        yield row
    tally.left_out += len(tally.changed) + len(tally.torn)


def kind_of(model: type) -> str:
    """The record kind (its schema's name) of a row model."""
    return next(k for k, m in SCHEMAS.items() if m is model)


def resume_rows(path, model: type[R], sources: dict) -> list[R]:
    """The rows a probe resumes from: those changed since written or torn are set aside into ``quarantine/`` beside
    the file (warned, naming it) and redone, like rows computed from a line the run no longer holds."""
    sealed = read_sealed(path)
    problem = sealed.problem()
    if problem:
        log.warning(f"warning: {problem}: set aside in {set_aside(sealed)}; those rows are computed again")
    return read_rows(path, model, sources)[0]


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


def _table_bytes(name: str, table) -> bytes:
    if name.endswith(".parquet"):
        buf = io.BytesIO()
        table.to_parquet(buf, index=False)
        return buf.getvalue()
    if name.endswith(".csv"):
        return table.to_csv(index=False).encode()
    return (json.dumps(table, indent=2, default=str) + "\n").encode()


def write_outputs(d: Path, tables: dict, *, rows: str | None = None, files: Iterable[Path] = ()) -> None:
    """A probe's tables (``{name: DataFrame}``, written as the name's suffix says: .parquet, .csv; a dict: .json),
    each atomically, then :data:`SEALS` last: the sha256 of each table and of each of ``files`` (its per-token
    files), and of ``rows`` (the row file in ``d`` the tables were computed from)."""
    d = Path(d)
    seals: dict = {"files": {}}
    for name, table in tables.items():
        data = _table_bytes(name, table)
        atomic_write(d / name, data)
        seals["files"][name] = hashlib.sha256(data).hexdigest()
    for f in files:
        seals["files"][str(Path(f).relative_to(d))] = file_sha256(f)
    if rows is not None:
        seals["rows"] = {"file": rows, "sha256": file_sha256(d / rows) if (d / rows).is_file() else None}
    atomic_write(d / SEALS, (json.dumps(seals, indent=1, sort_keys=True) + "\n").encode())


def _seals(d: Path) -> dict | None:
    try:
        got = json.loads((d / SEALS).read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise RunError(f"{d / SEALS}: unreadable ({e}); rerun {_rerun(d)} to write the outputs again") from None
    return got if isinstance(got, dict) and isinstance(got.get("files"), dict) else {"files": {}}


def _rerun(d: Path) -> str:
    run = d.parent.parent if d.parent.name == "probes" else d
    return f"python -m {PROBE_COMMANDS.get(d.name, 'probes.<the probe>')} {run}"


def _rows_problem(d: Path, seals: dict) -> str | None:
    """How the rows file differs from the one the tables were computed from (None: the same bytes)."""
    rows = seals.get("rows")
    if not isinstance(rows, dict) or not rows.get("file"):
        return None
    f = d / str(rows["file"])
    now = file_sha256(f) if f.is_file() else None
    if now == rows.get("sha256"):
        return None
    broken = read_sealed(f).problem() if f.is_file() else None
    return (f"{f}: " + (broken if broken else "changed since the tables beside it were computed from it")
            + f"; rerun {_rerun(d)} (it sets changed rows aside, computes them again and writes the tables)")


def sweep_outputs(d: Path) -> int:
    """Remove what a killed probe left half-written in its output directory (temporaries whose writer is gone), in
    ``d`` and ``d/tokens``; how many. Run by a probe as it starts, holding the directory's lock."""
    stale = [p for sub in (Path(d), Path(d) / "tokens") for p in stale_temporaries(sub)]
    for p in stale:
        p.unlink(missing_ok=True)
    return len(stale)


def verify_output(path) -> None:
    """``path`` (a table or a per-token file of a probe) is as its probe sealed it, and so is the rows file its
    tables came from; else :class:`RunError` naming what changed and the rerun that writes it again."""
    p = Path(path)
    d = p.parent if p.parent.name != "tokens" else p.parent.parent
    seals = _seals(d)
    name = str(p.relative_to(d))
    if seals is None or name not in seals["files"]:
        raise RunError(f"{p}: not sealed by its probe (written by an older version, or its session did not finish); "
                       f"rerun {_rerun(d)} to write it again")
    try:
        got = file_sha256(p)
    except (OSError, NotAFile) as e:
        raise RunError(f"{p}: unreadable ({e})") from None
    if got != seals["files"][name]:
        raise RunError(f"{p}: changed since its probe wrote it (its seal in {d / SEALS} does not match); never read. "
                       f"Rerun {_rerun(d)} to write it again")
    problem = _rows_problem(d, seals)
    if problem:
        raise RunError(problem)


def seal_problems(d: Path) -> list[str]:
    """Everything in a probe's output directory that is not as its probe wrote it (``python -m agent.rundir
    check``): sealed files changed or missing, per-token files never sealed, the rows file changed since its
    tables, rows whose own seals are broken."""
    d = Path(d)
    seals = _seals(d)
    if seals is None:
        return [f"{d}: no {SEALS} (written by an older version, or no session finished): rerun {_rerun(d)}"]
    out = []
    for name, sha in sorted(seals["files"].items()):
        f = d / name
        if not f.is_file():
            out.append(f"{f}: sealed but missing")
        elif file_sha256(f) != sha:
            out.append(f"{f}: changed since its probe wrote it")
    for f in sorted((d / "tokens").glob("*.parquet")) if (d / "tokens").is_dir() else []:
        if str(f.relative_to(d)) not in seals["files"]:
            out.append(f"{f}: not sealed (folded after the probe's last session ended)")
    problem = _rows_problem(d, seals)
    if problem:
        out.append(problem)
    elif isinstance(seals.get("rows"), dict) and (d / str(seals["rows"].get("file"))).is_file():
        broken = read_sealed(d / str(seals["rows"]["file"])).problem()
        if broken:
            out.append(broken)
    return out


def read_table(d: Path, stems: tuple[str, ...]) -> pd.DataFrame:
    """The probe's table ``<stem>.parquet`` (else ``.csv``) in ``d``, the first of ``stems`` that exists, read only
    as its probe sealed it (:func:`verify_output`)."""
    for stem in stems:
        for ext in (".parquet", ".csv"):
            f = d / f"{stem}{ext}"
            if f.is_file():
                verify_output(f)
                try:
                    return pd.read_parquet(f) if ext == ".parquet" else pd.read_csv(f)
                except (OSError, ValueError) as e:
                    raise RunError(f"{f}: unreadable ({e})") from None
    raise NoProbeOutput(f"{d}: no {' or '.join(s + '.parquet/.csv' for s in stems)} (the probe has not finished a step)")
