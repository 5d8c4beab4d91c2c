"""Shards of one run, and merging them back into one run directory (ours; issue 26).

    python -m agent.run … --seed S --shard I/N --out runs/x.shard-I     # on N nodes, or as N Slurm array tasks
    python -m agent.rundir merge runs/x runs/x.shard-*                  # then: one run directory

A shard is a run directory of its own (its own header, tool cache and lock), so N clients never share a
SQLite file: SQLite's WAL mode needs shared memory between its users and does not work over a network
filesystem (https://www.sqlite.org/wal.html, "all processes using a database must be on the same host
computer"). Which units a shard runs is a pure function of the run's ordered unit list (trial by trial,
samples in manifest order, as the runner orders them): unit j belongs to shard j mod N. That is balanced
(part sizes differ by at most one; each benchmark's contiguous rows are spread over every shard) and needs no
coordination: any scheduler that hands out an index (a Slurm array, a loop) can run the shards.

``merge OUT SHARD_DIR…`` refuses, before writing anything, shards that do not share one header (method,
variant, budgets, sampling with the seed, trials, benchmark and selection, model identity, tools, token
precision), that were cut from different unit lists, that overlap, that are not N distinct parts of N, or
that are incomplete (it lists what is missing: rerun those shards, the runner resumes them). It then writes
OUT as one runner would have: every unit's latest line (in the runner's order) with its token sidecar, the
query images (content-addressed: the same name is the same bytes), the skipped-samples list, and one tool
cache (the union; where two shards hold the same key, a good answer wins over a transient failure, else the
first shard's, and the number of disagreeing answers is reported). Judge grades and probe outputs are not
merged: grade and probe the merged run.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import sqlite3
import time
from pathlib import Path

from ..cli import done
from ..identity import same_model, server_differences
from ..tools.cache import ToolCache
from .check import check_run
from .common import IDENTITY_KEYS, RunError, inside, output_lock, write_json
from .index import raw_line
from .ledger import compute_ledger
from .writer import RunDir

log = logging.getLogger(__name__)

__all__ = ["merge_runs", "MERGE_KEYS", "merge_command"]

#: Header fields every shard must share (besides IDENTITY_KEYS and the model's identity).
MERGE_KEYS = tuple(k for k in IDENTITY_KEYS if k != "shard") + (
    "trials", "n_samples", "image_unload", "token_precision", "label", "seed_source")


def _tool_cache_of(path: Path, header: dict) -> Path | None:
    given = (header.get("tools") or {}).get("cache")
    p = Path(given) if given else path / "tools.sqlite"
    return p if p.exists() else None


def _header_diff(a: dict, b: dict) -> list[str]:
    out = [f"{k}: {a.get(k)!r} vs {b.get(k)!r}" for k in MERGE_KEYS if a.get(k) != b.get(k)]
    sa, sb = dict(a.get("selection") or {}), dict(b.get("selection") or {})
    if sa != sb:
        out.append(f"selection: {sa!r} vs {sb!r}")
    ta, tb = a.get("tools") or {}, b.get("tools") or {}
    for k in ("provider", "world", "cache_mode", "live_fallback"):
        if ta.get(k) != tb.get(k):
            out.append(f"tools.{k}: {ta.get(k)!r} vs {tb.get(k)!r}")
    ka, kb = (a.get("backend") or {}).get("kind"), (b.get("backend") or {}).get("kind")
    if ka != kb:
        out.append(f"backend: {ka!r} vs {kb!r}")
    m = same_model(a.get("model"), b.get("model")) or server_differences(a.get("model"), b.get("model"))
    if m:
        out.append(f"model: {m}")
    return out


def _plan(shard_dirs: list) -> tuple[list, dict]:
    """Open and check every shard; ``[(path, header, {unit: summary})]`` in shard order, and the first header."""

    if not shard_dirs:
        raise RunError("merge: no shard directories given")
    shards = []
    for d in shard_dirs:
        rd = RunDir(Path(d))
        if not rd.header_path.exists():
            raise RunError(f"{d}: no header.json — not a run directory of python -m agent.run")
        h = rd.read_header()
        if not h.get("shard"):
            raise RunError(f"{d}: not a shard (its header has no 'shard'; was it run with --shard I/N?)")
        shards.append((rd.path, h, rd.latest()))
    first = shards[0][1]
    for p, h, _ in shards[1:]:
        diff = _header_diff(first, h)
        if diff:
            raise RunError(f"{p} is not a shard of the same run as {shards[0][0]}: {'; '.join(diff)}")
    n = {h["shard"]["of"] for _, h, _ in shards}
    sha = {h["shard"]["units_sha256"] for _, h, _ in shards}
    if len(n) > 1 or len(sha) > 1:
        raise RunError("merge: the shards were cut from different unit lists (N: "
                       f"{sorted(n)}; unit lists: {len(sha)} different): run every shard with the same command "
                       "and selection, changing only I in --shard I/N")
    (n,) = n
    idx = sorted(h["shard"]["index"] for _, h, _ in shards)
    dup = sorted({i for i in idx if idx.count(i) > 1})
    if dup:
        raise RunError(f"merge: shard index {dup[0]} of {n} given twice: "
                       + ", ".join(str(p) for p, h, _ in shards if h["shard"]["index"] == dup[0]))
    missing = sorted(set(range(n)) - set(idx))
    if missing:
        raise RunError(f"merge: {len(missing)} of the {n} shards are not given (indices {missing[:20]}); "
                       "pass every shard directory")
    seen: dict = {}
    for p, h, latest in shards:
        for k in latest:
            if k in seen:
                raise RunError(f"merge: unit {k[0]} trial {k[1]} is in {seen[k]} and in {p}: the shards overlap")
            seen[k] = p
    short = [(p, h["shard"]["units"] - len(latest)) for p, h, latest in shards if len(latest) < h["shard"]["units"]]
    if short:
        raise RunError("merge: incomplete shards — " + "; ".join(f"{p}: {m} unit(s) missing" for p, m in short)
                       + ". Rerun their commands (the runner resumes them), then merge")
    total = first["shard"]["all_units"]
    if len(seen) != total:
        raise RunError(f"merge: the shards hold {len(seen)} units, the run has {total}")
    for p, _, _ in shards:  # a truncated or missing sidecar, a missing image: refused before anything is written
        rep = check_run(p)
        bad = rep.sidecars + [(u, f"image {h}… is not stored") for u, h in rep.missing_images]
        if bad or rep.torn:
            first_bad = f"{bad[0][0]}: {bad[0][1]}" if bad else f"{len(rep.torn)} torn line(s)"
            raise RunError(f"merge: {p} is damaged: {first_bad} ({len(bad) + len(rep.torn)} problem(s) in all; "
                           f"python -m agent.rundir check {p} lists them)")
    return sorted(shards, key=lambda s: s[1]["shard"]["index"]), first


def _merge_caches(out: Path, caches: list[Path]) -> dict:
    dst = ToolCache(out)
    dst.close()
    stats = {"entries": 0, "from_shards": 0, "same": 0, "disagreeing": 0, "transient_replaced": 0}
    con = sqlite3.connect(out, isolation_level=None)
    try:
        con.execute("PRAGMA journal_mode=WAL")
        for c in caches:
            con.execute("ATTACH DATABASE ? AS s", (str(c),))
            try:
                stats["from_shards"] += con.execute("SELECT COUNT(*) FROM s.tool_cache").fetchone()[0]
                stats["same"] += con.execute(
                    "SELECT COUNT(*) FROM s.tool_cache t JOIN main.tool_cache m USING(key) WHERE "
                    "m.observation = t.observation AND m.ok = t.ok").fetchone()[0]
                stats["disagreeing"] += con.execute(  # two good answers that differ (live results change)
                    "SELECT COUNT(*) FROM s.tool_cache t JOIN main.tool_cache m USING(key) WHERE "
                    "(m.observation != t.observation OR m.ok != t.ok) AND m.transient = 0 AND t.transient = 0"
                ).fetchone()[0]
                stats["transient_replaced"] += con.execute(
                    "SELECT COUNT(*) FROM s.tool_cache t JOIN main.tool_cache m USING(key) WHERE m.transient = 1 "
                    "AND t.transient = 0").fetchone()[0]
                # the cache's own rule (ToolCache.put): a good answer replaces a stored transient failure only
                con.execute("INSERT INTO main.tool_cache SELECT * FROM s.tool_cache WHERE true ON CONFLICT(key) DO "
                            "UPDATE SET raw=excluded.raw, observation=excluded.observation, ok=excluded.ok, "
                            "transient=0, created=excluded.created WHERE tool_cache.transient=1 AND "
                            "excluded.transient=0")
            finally:
                con.execute("DETACH DATABASE s")
        stats["entries"] = con.execute("SELECT COUNT(*) FROM tool_cache").fetchone()[0]
    finally:
        con.close()
    return stats


def _merged_header(first: dict, shards: list) -> dict:
    """The merged run's header: the shards' shared one, with what each shard was and how they were merged."""
    header = {k: v for k, v in first.items() if k not in ("shard", "resumed")}
    header["created"] = min(h.get("created") or time.time() for _, h, _ in shards)
    header["backend"] = {**(first.get("backend") or {}), "endpoints": sorted(
        {e for _, h, _ in shards for e in (h.get("backend") or {}).get("endpoints") or []})}
    header["merged_from"] = [{"dir": str(p), "index": h["shard"]["index"], "of": h["shard"]["of"],
                              "units": h["shard"]["units"], "created": h.get("created"), "argv": h.get("argv"),
                              "endpoints": (h.get("backend") or {}).get("endpoints"),
                              "processes": h.get("processes"), "resumed": len(h.get("resumed") or [])}
                             for p, h, _ in shards]
    header["merged"] = {"at": time.time(), "shards": len(shards), "units": first["shard"]["all_units"],
                        "units_sha256": first["shard"]["units_sha256"]}
    if header.get("tools", {}).get("cache"):
        header["tools"] = {**header["tools"], "cache": None}  # merged into OUT/tools.sqlite
    return header


def _copy_lines(rd: RunDir, out: Path, shards: list, progress) -> tuple[int, int]:
    """Each unit's latest line with its sidecar, shard by shard in the order each shard wrote them (a runner's file is
    in completion order too: every reader sorts what it needs). ``(lines, sidecars)``."""
    n_lines = n_tokens = 0
    order = [(si, kv) for si, (_, _, latest) in enumerate(shards)
             for kv in sorted(latest.items(), key=lambda kv: kv[1].get("_o", 0))]
    for si, (key, summary) in order:
        src = shards[si][0]
        line = raw_line(src / "results.jsonl", summary)  # as written: sealed again as it is
        where = f"{src / 'results.jsonl'} ({key[0]} trial {key[1]}): tokens_file"
        tf = inside(src, line["tokens_file"], where) if line.get("tokens_file") else None  # never out of the shard
        if tf is not None:
            dst = inside(out, line["tokens_file"], f"{src / 'results.jsonl'} ({key[0]} trial {key[1]}): tokens_file")
            if not tf.is_file():
                raise RunError(f"{tf}: the token sidecar of {key[0]} trial {key[1]} is missing")
            dst.parent.mkdir(parents=True, exist_ok=True)
            _link_or_copy(tf, dst)
            n_tokens += 1
        rd.append_line(line)
        n_lines += 1
        if progress:
            progress(n_lines, len(order))
    return n_lines, n_tokens


def merge_runs(out, shard_dirs: list, *, progress=None) -> dict:
    """Merge complete, consistent shards into the new run directory ``out``; return what was written. One merge
    into ``out`` at a time (the lock lives beside it: a second is refused at once)."""
    out = Path(out)
    with output_lock(out.parent, f"merge into {out.name}", f".{out.name}.merge.lock"):
        return _merge_runs(out, shard_dirs, progress)


def _merge_runs(out: Path, shard_dirs: list, progress) -> dict:
    shards, first = _plan([Path(d) for d in shard_dirs])
    done = _finished(out, shards)
    if done is not None:  # a rerun after the merge finished (killed after its rename): nothing left to do
        log.info(f"{out}: already merged from these {len(shards)} shards (merge.json)")
        return done
    if out.exists() and any(out.iterdir()):
        raise RunError(f"{out} exists and is not empty: merge writes a new run directory")
    for p, _, _ in shards:
        if out.resolve() == p.resolve():
            raise RunError(f"{out}: the output is one of the shards")
    # built beside OUT and renamed into place at the end: a merge that fails half-way (a full disk) leaves no
    # half-written OUT behind, and rerunning the same command starts it afresh (the shards are only read)
    final, out = out, out.parent / f".{out.name}.merging"
    if out.exists():
        shutil.rmtree(out)  # a previous merge's leftovers: ours, never a run directory
    rd = RunDir(out, token_precision=first.get("token_precision") or "float32")
    header = _merged_header(first, shards)
    rd.lock()
    try:
        rd.write_header(header)
        n_lines, n_tokens = _copy_lines(rd, out, shards, progress)
        images: set[str] = set()
        for p, _, _ in shards:
            for f in sorted((p / "images").glob("*")) if (p / "images").is_dir() else []:
                if f.name.startswith(".") or f.name in images:
                    continue
                f = inside(p / "images", f.name, f"{p / 'images'}")  # a symlink out of the shard is refused
                dst = out / "images" / f.name
                if not dst.exists():
                    _link_or_copy(f, dst)
                images.add(f.name)
        skipped = shards[0][0] / "skipped_samples.json"
        if skipped.exists():
            shutil.copyfile(skipped, out / "skipped_samples.json")
        found = [(p, _tool_cache_of(p, h)) for p, h, _ in shards]
        caches = [c for _, c in found if c is not None]
        no_cache = [str(p) for p, c in found if c is None]
        if no_cache:  # the lines hold every observation; an exact replay of the merged run would miss these
            log.warning(f"warning: no tool cache found for {len(no_cache)} shard(s) ({', '.join(no_cache[:3])}): the "
                        "merged cache lacks their entries (recorded in merge.json)")
        cache = _merge_caches(out / "tools.sqlite", caches) if caches else None
    finally:
        rd.unlock()
    rep = {"out": str(final), "shards": len(shards), "lines": n_lines, "sidecars": n_tokens, "images": len(images),
           "tool_cache": cache, "shards_without_tool_cache": no_cache,
           "shard_dirs": [str(p.resolve()) for p, _, _ in shards]}
    led = compute_ledger(out)  # the merged run's cost ledger (the shards' own stay in their directories)
    write_json(out / "ledger.json", {**led, "run_dir": str(final)}, indent=2)
    write_json(out / "merge.json", rep, indent=2)  # the completion marker, written last
    if final.exists():  # an empty directory (checked above)
        final.rmdir()
    os.replace(out, final)  # one rename: OUT is either absent or whole, ledger included
    return rep


def _finished(out: Path, shards: list) -> dict | None:
    """``out``'s merge report when ``out`` is the finished merge of exactly these shards, else None."""
    try:
        rep = json.loads((out / "merge.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(rep, dict) or sorted(rep.get("shard_dirs") or []) != sorted(str(p.resolve()) for p, _, _ in shards):
        return None
    return rep


def _link_or_copy(src: Path, dst: Path) -> None:
    """A hard link where the filesystem allows (same device: no bytes copied), else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def merge_command(a) -> int:
    """``python -m agent.rundir merge`` once its arguments parse (agent/rundir/cli.py holds its flags)."""
    def progress(done: int, total: int) -> None:  # a paper-scale merge writes thousands of lines
        if done == total or done % max(total // 10, 1) == 0:
            log.info(f"merge: {done}/{total} units written")

    try:
        rep = merge_runs(a.out, a.shards, progress=progress)
    except RunError as e:
        log.error(f"error: {e}")
        return 2
    c = rep["tool_cache"]
    print(f"merged {rep['shards']} shards: {rep['lines']} units, {rep['sidecars']} token sidecars, {rep['images']} "
          "images" + (f"; tool cache: {c['entries']} entries from {c['from_shards']} ({c['same']} held by several "
                      f"shards alike, {c['disagreeing']} disagreeing: the first shard's kept)" if c else ""))
    done([f"{a.out}/ (results.jsonl, tokens/, images/, tools.sqlite, header.json, merge.json)"],
         f"python -m agent.rundir check {a.out}   |   python -m agent.judge {a.out}")
    return 0
