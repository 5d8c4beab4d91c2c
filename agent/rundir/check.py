"""``python -m agent.rundir check RUN_DIR [--repair]``: is a run complete and intact? Units expected vs present,
duplicates, torn lines, sidecars against their calls, orphaned and temporary files, images, the tool cache."""
from __future__ import annotations

import errno
import json
import logging
import os
import sqlite3
import stat
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..benchmarks import resolve_benchmark
from ..cli import done
from ..paths import open_regular
from ..record import SchemaError, validate
from .common import RunError, inside, token_key
from .grades import grade_file
from .index import summary_of
from .lines import SEAL_KEY, read_line, read_sealed, set_aside
from .probe_outputs import PROBE_COMMANDS, seal_problems
from .shards import shard_units
from .sidecar import decode, read_prompt_pieces
from .writer import RunDir

log = logging.getLogger(__name__)


@dataclass
class CheckReport:
    """What ``python -m agent.rundir check`` found (see :func:`check_run`)."""

    path: str
    expected: int | None = None
    present: int = 0
    statuses: dict = field(default_factory=dict)
    missing: list = field(default_factory=list)          # (sample_id, trial) without a line
    duplicates: list = field(default_factory=list)       # keys with two final (non error/timeout) lines
    superseded: int = 0                                  # error/timeout lines later retried (normal)
    torn: list = field(default_factory=list)             # (line number, first bytes)
    changed: list = field(default_factory=list)          # (line number, sample_id/trial): edited since written
    invalid: list = field(default_factory=list)          # (line number or file, what does not match its schema)
    sidecars: list = field(default_factory=list)         # (sample_id/trial, problem)
    orphans: list = field(default_factory=list)          # token files no line names
    temp_files: list = field(default_factory=list)
    in_flight: int = 0                                   # units with recorded calls in RUN/inflight/ (resumable)
    missing_images: list = field(default_factory=list)   # (sample_id/trial, sha256)
    cache: str = "absent"                                # "ok", "absent", or the integrity problem
    grades: dict = field(default_factory=dict)           # judge-*.jsonl -> the grades that cannot be counted
    index: str = "ok"                                    # "ok", "none" (no lines), or what is wrong with it
    special: list = field(default_factory=list)          # FIFOs, devices, sockets where files should be (never read)
    probes: list = field(default_factory=list)           # what in RUN/probes/ is not as its probe wrote it
    replay_of: str | None = None                         # a removal probe's replay directory: the run it replays
    repaired: list = field(default_factory=list)

    @property
    def intact(self) -> bool:
        return not (self.torn or self.changed or self.invalid or self.duplicates or self.sidecars or self.missing_images
                    or self.special or self.grades or self.probes or self.cache not in ("ok", "absent"))

    @property
    def complete(self) -> bool:
        return not self.missing and (self.expected is None or self.present >= self.expected)

    def lines(self) -> list[str]:
        out = [f"{self.path}: {'intact' if self.intact else 'DAMAGED'}, "
               f"{'complete' if self.complete else 'INCOMPLETE'}",
               f"  units: {self.present} present of {self.expected if self.expected is not None else '?'} expected "
               f"{dict(sorted(self.statuses.items()))}; {self.superseded} superseded by retries"]
        for name, items in (("missing units", self.missing), ("duplicated units", self.duplicates),
                            ("torn or unparseable lines", self.torn),
                            ("lines changed since they were written (left out by every reader)", self.changed),
                            ("records that do not match their schema (agent/record/)", self.invalid),
                            ("sidecar problems", self.sidecars),
                            ("orphaned token files", self.orphans), ("temporary files", self.temp_files),
                            ("missing images", self.missing_images),
                            ("entries that are not regular files (never read: FIFOs, devices, sockets)", self.special)):
            if items:
                shown = ", ".join(str(x) for x in items[:5])
                out.append(f"  {len(items)} {name}: {shown}{' …' if len(items) > 5 else ''}")
        if self.in_flight:
            out.append(f"  {self.in_flight} unit(s) in flight with recorded calls (RUN/inflight/): the rerun "
                       "continues each from its last completed call")
        out.append(f"  index: {self.index}")
        out.append(f"  tool cache: {self.cache}")
        for problem in self.probes:
            out.append(f"  probe output: {problem}")
        for problem in self.grades.values():
            out.append(f"  grades: {problem}; never counted in a table (python -m agent.judge grades those units "
                       "again; --repair moves them to quarantine/)")
        out += [f"  repaired: {r}" for r in self.repaired]
        return out

    def to_dict(self) -> dict:
        return {**asdict(self), "intact": self.intact, "complete": self.complete}


def _expected_keys(rd: "RunDir", header: dict) -> set | None:
    """The (sample, trial) units the run was asked for, from the manifest and the recorded selection (None for a
    removal probe's replay directory: the probe chose its units, python -m probes.removal says which)."""
    if header.get("replay_of") or header.get("remove_images_from_step") is not None:
        return None
    sel = header.get("selection") or {}
    try:
        m = resolve_benchmark(header.get("benchmark_path") or header.get("benchmark", ""))
    except Exception:  # noqa: BLE001 - the manifest moved: fall back to the recorded count
        return None
    samples = m.samples
    if sel.get("sample_ids"):
        want = set(sel["sample_ids"])
        samples = [s for s in samples if s.id in want]
    if sel.get("limit") is not None:
        samples = samples[: sel["limit"]]
    skipped = set(sel.get("skipped") or [])
    units = [(s.id, t) for t in range(int(header.get("trials") or 1)) for s in samples if s.id not in skipped]
    shard = header.get("shard")
    if shard:  # a shard of a run (agent.run --shard I/N): its part of the units
        units = shard_units(units, int(shard["index"]), int(shard["of"]))
    return set(units)


def _read_lines(rd: RunDir, rep: CheckReport) -> tuple[list, list]:
    """The summaries of the intact lines (with the images each needs) and the raw torn lines; lines changed since
    they were written (their checksum does not match) are reported and left out."""
    good: list[dict] = []
    torn_raw: list[bytes] = []
    if not rd.results.exists() or "results.jsonl" in rep.special:
        return good, torn_raw
    rd.index(warn=False, project=lambda e: {})  # where the index knew a sealed line that no longer parses: changed
    # (not torn); a projecting reader never rewrites the index, so check writes nothing
    changed_at = {o: (sid, t) for sid, t, o in rd.changed}
    with open_regular(rd.results, "rb", RunError) as f:
        offset = 0
        for n, raw in enumerate(f, 1):
            at, offset = offset, offset + len(raw)
            if not raw.strip():
                continue
            line, state = read_line(raw)
            if at in changed_at:
                line, state = {"sample_id": changed_at[at][0], "trial": changed_at[at][1]}, "changed"
            if state == "torn":
                rep.torn.append((n, raw[:60].decode(errors="replace")))
                torn_raw.append(raw)
            elif state == "changed":  # never counted as the unit's record: it reruns on resume
                rep.changed.append((n, f"{line.get('sample_id')}/t{line.get('trial')}"))
            else:  # keep the summary and the images the line needs, not the line: memory stays bounded
                try:
                    validate("result", line, f"line {n}")
                except SchemaError as e:
                    rep.invalid.append((n, str(e)))
                good.append({**summary_of(line), "_need": _images_needed(line)})
    return good, torn_raw


def _images_needed(line: dict) -> set:
    need = set((line.get("query_images") or {}).values())
    need |= {h for e in line.get("events") or [] if e.get("type") == "tool_call" for h in e.get("result_images") or []}
    need |= {p.get("sha256") for m in line.get("messages") or [] if isinstance(m.get("content"), list)
             for p in m["content"] if isinstance(p, dict) and p.get("type") == "image" and p.get("sha256")}
    return need


def _count_units(rd: RunDir, header: dict, rep: CheckReport, good: list) -> dict:
    """Duplicates, superseded lines, statuses, and the units expected vs present; returns the latest per unit."""
    by_key: dict = {}
    for ln in good:
        by_key.setdefault((ln["sample_id"], int(ln["trial"])), []).append(ln)
    for key, lns in by_key.items():
        final = [x for x in lns if x.get("status") not in ("error", "timeout")]
        if len(final) > 1:
            rep.duplicates.append(key)
        rep.superseded += len(lns) - 1 if len(final) <= 1 else 0
    latest = {k: v[-1] for k, v in by_key.items()}
    rep.present = len(latest)
    for ln in latest.values():
        rep.statuses[ln.get("status")] = rep.statuses.get(ln.get("status"), 0) + 1
    expected = _expected_keys(rd, header)
    if expected is not None:
        rep.expected = len(expected)
        rep.missing = sorted(expected - set(latest))
    else:
        n = (header.get("selection") or {}).get("n_samples")
        rep.expected = n * int(header.get("trials") or 1) if n is not None else None
        if header.get("shard"):
            rep.expected = int(header["shard"]["units"])
    return latest


def _check_sidecars(rd: RunDir, rep: CheckReport, good: list, latest: dict) -> None:
    """Each latest line's sidecar: readable, its token counts per call those of the line, its prompt ids readable;
    and the sidecars no line names (orphans)."""
    named = {ln.get("tokens_file") for ln in good if ln.get("tokens_file")}
    for key, ln in latest.items():
        unit, tf = f"{key[0]}/t{key[1]}", ln.get("tokens_file")
        want = {c["index"]: c.get("n_tokens", 0) for c in ln.get("calls") or []}
        if not tf:
            if any(want.values()):
                rep.sidecars.append((unit, "tokens recorded but no sidecar named"))
            continue
        try:
            path = inside(rd.path, tf, "tokens_file")
        except RunError:
            rep.sidecars.append((unit, f"results.jsonl names tokens_file {tf!r}, which leads outside the run "
                                       "directory (refused)"))
            continue
        if not ln.get("tokens_sha256"):
            rep.sidecars.append((unit, f"{tf}: the line keeps no checksum of its sidecar"))
            continue
        try:  # its bytes, its schema, its footer's top-k against the lists it holds
            call = decode(path, ["call", "top_ids"], sha256=ln["tokens_sha256"])["call"]
        except Exception as e:  # noqa: BLE001 - any unreadable file is the finding
            rep.sidecars.append((unit, f"{tf}: {e}" if isinstance(e, (OSError, ValueError))
                                 else f"{tf} unreadable ({type(e).__name__})"))
            continue
        got = {int(c): int((call == c).sum()) for c in np.unique(call)}
        if {c: n for c, n in want.items() if n} != got:
            rep.sidecars.append((unit, f"{tf}: token counts per call {got} != calls {want}"))
        try:  # the prompts' token ids it may carry (agent/backends/pieces.py): the probes send them again
            read_prompt_pieces(path)
        except (OSError, ValueError) as e:
            rep.sidecars.append((unit, f"{tf}: unreadable prompt ids ({e})"))
    tok_dir = rd.path / "tokens"
    if tok_dir.is_dir():
        rep.orphans = sorted(f"tokens/{p.name}" for p in tok_dir.glob("*.parquet") if f"tokens/{p.name}" not in named)


def _check_images_and_cache(rd: RunDir, header: dict, rep: CheckReport, latest: dict) -> None:
    stored = set()
    for p in sorted((rd.path / "images").glob("*")) if (rd.path / "images").is_dir() else []:
        if f"images/{p.name}" in rep.special:
            continue
        try:
            inside(rd.path / "images", p.name, "images")
            stored.add(p.name.split(".")[0])
        except RunError:  # a symlink leading out of the run directory: never read, so counted as missing
            rep.sidecars.append(("images", f"images/{p.name} leads outside the run directory (refused)"))
    replayed = _replayed_run(rd, header)
    if replayed is not None and (replayed / "images").is_dir():  # a replay's images are the run's it replays
        stored |= {p.name.split(".")[0] for p in (replayed / "images").iterdir() if p.is_file()}
    for key, ln in latest.items():
        rep.missing_images += [(f"{key[0]}/t{key[1]}", h[:12]) for h in sorted(ln["_need"] - stored)]
    cache = (header.get("tools") or {}).get("cache") or str(rd.path / "tools.sqlite")
    if f"{Path(cache).name}" in rep.special and Path(cache).parent == rd.path:
        rep.cache = "not a regular file (never opened)"
    elif Path(cache).exists():
        rep.cache = _cache_integrity(cache)


def _cache_integrity(cache: str) -> str:
    """The tool cache's integrity, read only. A WAL database's reader makes its ``-shm`` file, which a full disk
    refuses ("disk I/O error"): then it is read again as immutable (no file made), which says whether its pages
    hold together without touching the disk."""
    last = None
    for mode in ("ro", "ro&immutable=1"):
        try:
            con = sqlite3.connect(f"file:{cache}?mode={mode}", uri=True, timeout=30)
            try:
                res = con.execute("PRAGMA integrity_check").fetchall()
            finally:
                con.close()
            return "ok" if res == [("ok",)] else "; ".join(r[0] for r in res[:5])
        except sqlite3.OperationalError as e:
            last = e
        except sqlite3.Error as e:
            return f"unreadable ({e})"
    return f"unreadable ({last})"


def _replayed_run(rd: RunDir, header: dict) -> Path | None:
    """The run a removal probe's replay directory replays: the one it lies in (``RUN/probes/removal/k<k>``, a
    copied or moved run included), else the path its header records; None for any other run."""
    if not header.get("replay_of"):
        return None
    here = rd.path.parent.parent.parent
    return here if (here / "header.json").is_file() else Path(header["replay_of"])


def _special_files(root: Path) -> list[str]:
    """Everything under the run directory that is neither a directory nor a regular file (a symlink is followed:
    one to a FIFO counts), by its name relative to the run. Nothing here is ever opened."""
    out = []
    for top, dirs, files in os.walk(root):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(top, d))]:
            p = os.path.join(top, name)
            try:
                mode = os.stat(p).st_mode
            except OSError:  # a dangling symlink: what reads it names it
                continue
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                out.append(os.path.relpath(p, root))
    return sorted(out)


def _check_grades(rd: RunDir, rep: CheckReport, latest: dict) -> dict:
    """The judge's files too, each grade against its seal and the line it grades: ``{file: GradeFile}`` of those
    holding grades that cannot be counted (changed, torn, or of a line the run does not hold)."""
    sources = {k: ln[SEAL_KEY] for k, ln in latest.items() if SEAL_KEY in ln}
    bad = {}
    for jf in sorted(rd.path.glob("judge-*.jsonl")):
        if jf.name in rep.special:
            continue
        gf = grade_file(jf, sources)
        if gf.problem():
            rep.grades[jf.name], bad[jf] = gf.problem(), gf
    return bad


def _check_probes(rd: RunDir) -> list[str]:
    """Every probe's output under RUN/probes/ against its seals (agent/rundir/probe_outputs.py), and the result
    lines of the removal probe's replay directories against theirs."""
    out: list[str] = []
    root = rd.path / "probes"
    for name in PROBE_COMMANDS:
        d = root / name
        if not d.is_dir() or not any(d.iterdir()):
            continue
        out += seal_problems(d)
        for k in sorted(d.glob("k*/results.jsonl")) if name == "removal" else []:
            problem = read_sealed(k).problem()
            if problem:
                out.append(f"{problem}; python -m probes.removal {rd.path} replays those again")
    return out


def check_run(path, *, deep: bool = True, repair: bool = False, heal_torn: bool = False) -> CheckReport:
    """Is this run complete and intact? ``deep=False`` is the cheap part (lines, temp files) the runner
    runs on resume; ``repair`` quarantines torn lines and orphans (never deletes them) and removes temp files.
    ``heal_torn``: the caller holds the run lock (the runner resuming) and torn lines go to quarantine/ (their units
    run again)."""
    rd = RunDir(path)
    header = rd.read_header()
    rep = CheckReport(str(rd.path), replay_of=header.get("replay_of"))
    rep.special = _special_files(rd.path)
    try:
        validate("header", header, "header.json")
    except SchemaError as e:
        rep.invalid.append(("header.json", str(e)))
    if not (rd.results.exists() and rd.results.stat().st_size):
        rep.index = "none (no lines yet)"
    elif not rd.index_path.exists():  # every writer keeps one: it was deleted, or left behind by a copy
        rep.index = ("MISSING: results.index.jsonl was deleted or not copied with the run; every line was checked "
                     "against its own checksum, and the next reader rebuilds the index")
    good, torn_raw = _read_lines(rd, rep)
    latest = _count_units(rd, header, rep, good)
    if (rd.path / "inflight").is_dir():
        # a unit whose final line is written is not in flight (a kill between the line and the journal's
        # removal leaves its journal; the rerun prunes it); a line that ended in error or timeout runs again
        done = {token_key(s, t) for (s, t), ln in latest.items() if ln.get("status") not in ("error", "timeout")}
        rep.in_flight = sum(1 for d in (rd.path / "inflight").iterdir()
                            if d.is_dir() and not d.name.startswith(".") and d.name not in done)
    for d in (rd.path, rd.path / "tokens", rd.path / "images"):
        if d.is_dir():
            rep.temp_files += [str(p.relative_to(rd.path)) for p in d.iterdir() if ".tmp" in p.name]
    if deep:
        _check_sidecars(rd, rep, good, latest)
        _check_images_and_cache(rd, header, rep, latest)
    bad_grades = _check_grades(rd, rep, latest)
    if deep:
        rep.probes = _check_probes(rd)
    if heal_torn and not repair:
        _quarantine_torn(rd, rep, torn_raw)
    if repair:
        _repair(rd, rep, torn_raw)
        for jf, gf in bad_grades.items():
            q = set_aside(gf.sealed, gf.unusable())
            if q is not None:  # bad_grades holds only files with a problem, so something moved
                rep.repaired.append(f"{jf.name}: the grades that cannot be counted moved to {q.relative_to(rd.path)} "
                                    "(python -m agent.judge grades those units again)")
        rep.grades = {}
    return rep


def _quarantine_torn(rd: "RunDir", rep: CheckReport, torn_raw: list) -> None:
    """The torn lines copied into quarantine/ and blanked in place (the run lock is the caller's)."""
    if not torn_raw:
        return
    stamp = time.strftime("%Y%m%d-%H%M%S")
    q = rd.path / "quarantine"
    q.mkdir(exist_ok=True)
    with open(q / f"torn-lines-{stamp}.jsonl", "ab") as f:  # appended: two heals in one second keep both
        f.write(b"".join(r if r.endswith(b"\n") else r + b"\n" for r in torn_raw))
    # blanked in place (spaces, same length; readers skip blank lines): no copy of the file, so a repair needs no
    # free space the size of results.jsonl (a full disk is when it is needed most)
    _blank_lines(rd.results, set(torn_raw))
    rd.index_path.unlink(missing_ok=True)  # its entries no longer match the blanked lines
    rep.repaired.append(f"{len(torn_raw)} torn line(s) moved to quarantine/torn-lines-{stamp}.jsonl")
    rep.torn = []


def _blank_lines(path: Path, lines: set) -> None:
    """Overwrite these lines of ``path`` with spaces in place (same length; readers skip blank lines): no copy of
    the file, so no free space the size of it is needed."""
    with open(path, "rb") as src, open(path, "r+b") as dst:  # streamed: one line in memory
        pos = 0
        for raw in src:
            if raw.strip() and raw in lines:
                dst.seek(pos)
                dst.write(b" " * len(raw[:-1] if raw.endswith(b"\n") else raw))
            pos += len(raw)
        dst.flush()
        os.fsync(dst.fileno())


def _repair(rd: "RunDir", rep: CheckReport, torn_raw: list) -> None:
    rd.lock(wait_s=0.5)  # no runner may append while results.jsonl is rewritten
    try:
        q = rd.path / "quarantine"
        _quarantine_torn(rd, rep, torn_raw)
        if rep.orphans:
            (q / "tokens").mkdir(parents=True, exist_ok=True)
            for o in rep.orphans:
                os.replace(rd.path / o, q / o)
            rep.repaired.append(f"{len(rep.orphans)} orphaned token file(s) moved to quarantine/tokens/")
            rep.orphans = []
        for t in rep.temp_files:
            (rd.path / t).unlink(missing_ok=True)
        if rep.temp_files:
            rep.repaired.append(f"{len(rep.temp_files)} temporary file(s) removed")
            rep.temp_files = []
    finally:
        rd.unlock()


def check_command(a) -> int:
    """``python -m agent.rundir check`` once its arguments parse (agent/rundir/cli.py holds its flags)."""
    try:
        rep = check_run(a.run_dir, repair=a.repair)
    except RunError as e:
        log.error(f"error: {e}")
        return 2
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        log.error(f"error: {e.filename or a.run_dir}: the disk is full; --repair needs only room for the torn lines' "
                  "copy in quarantine/ (a few KB: lines are blanked in place, never copied); free that much and rerun")
        return 5
    print(json.dumps(rep.to_dict(), indent=1, default=str) if a.json else "\n".join(rep.lines()))
    if not rep.intact:
        log.info("damaged: python -m agent.rundir check RUN_DIR --repair quarantines torn lines and orphans; "
                 "rerun the run command to redo the units they held")
    elif not a.json:
        done([f"{a.run_dir}/quarantine/"] if a.repair else [],
             f"python -m agent.show {a.run_dir}" if rep.complete else
             f"python -m probes.removal {rep.replay_of} continues the replays" if rep.replay_of else
             "rerun the run's command (python -m agent.run ... with the same --out) to finish the missing units")
    return 0 if rep.intact and rep.complete else 1
