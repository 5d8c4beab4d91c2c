"""A run directory: header first, one JSONL line per finished (sample, trial), columnar token sidecars.

    RUN/header.json          arguments, versions, backend, tools; written first (identity checked on resume)
    RUN/results.jsonl        one line per finished (sample, trial); a line is appended only when complete
    RUN/tokens/<key>.parquet per-token arrays of that line's LLM calls (written before the line)
    RUN/images/<sha256>.<ext> each query image once, by content hash
    RUN/tools.sqlite         the tool cache (record/replay), unless --tool-cache points elsewhere

Reading (a notebook can do the same):

    from agent.rundir import load_run
    run = load_run("runs/demo")
    run.samples()          # pandas, one row per (sample, trial)
    run.calls()            # pandas, one row per LLM call
    run.tokens(line)       # dict of numpy arrays for that line (call, id, logprob, think, top_logprobs, …)
    run.call_messages(line, call_event)   # the exact messages of that call (images as sha256 parts)

A line for the same (sample, trial) written later (``--retry-errors``) supersedes the earlier one.
A torn last line (a crash mid-write) is reported and ignored; the pair is rerun on resume.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .http import dumps
from .sidecar import RELEASE_COLUMNS, read_parquet  # noqa: F401  (re-exported: older imports keep working)
from .sidecar import decode as _decode_sidecar
from .sidecar import encode as _encode_sidecar

__all__ = ["RunDir", "Run", "load_run", "RunError", "IDENTITY_KEYS", "versions", "token_key", "read_parquet",
           "TOKEN_PRECISIONS"]

#: How the top-k logprobs are stored. float32 (default) keeps the server's values; with zstd and
#: byte-stream-split it takes ~94 bytes per generated token with top-20 ids and logprobs over a 248k
#: vocabulary (scripts/bench_runner.py). float16 takes ~60 and moves the grouped entropy by <= 1e-3
#: nats (mean ~2e-4). The sampled token's logprob and the exact entropy are always float32.
TOKEN_PRECISIONS = ("float32", "float16")

#: How many resumes header.json remembers (the first five and the latest ones).
RESUME_HISTORY = 50

#: Header fields that must match when a run directory is resumed.
IDENTITY_KEYS = ("method", "variant", "benchmark", "remove_images_from_step", "budgets", "sampling", "schema_version",
                 "history_reasoning", "observation_images")


class RunError(RuntimeError):
    """A run directory that cannot be used as asked (foreign header, unreadable file)."""


def versions() -> dict:
    import importlib.metadata as md
    import platform

    out = {"python": platform.python_version()}
    for pkg in ("mmcf-toolkit", "numpy", "pyarrow", "httpx", "torch", "transformers", "sglang"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


def token_key(sample_id: str, trial: int) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", str(sample_id))[:60]
    return f"{safe}-{hashlib.sha1(str(sample_id).encode()).hexdigest()[:8]}__t{int(trial)}"


def _tmp_name(path: Path) -> Path:
    """A temporary sibling unique to this process and thread (appends may run in worker threads)."""
    return path.with_name(f"{path.name}.tmp{os.getpid()}-{threading.get_ident()}")


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = _tmp_name(path)
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@dataclass
class RunDir:
    path: Path
    token_precision: str = "float32"

    def __post_init__(self):
        if self.token_precision not in TOKEN_PRECISIONS:
            raise ValueError(f"token precision must be one of {TOKEN_PRECISIONS}, got {self.token_precision!r}")
        self.path = Path(self.path)
        self.results = self.path / "results.jsonl"
        self.header_path = self.path / "header.json"

    # ------------------------------------------------------------------ header
    def write_header(self, header: dict, *, force: bool = False) -> dict:
        """Write the header, or check that an existing one describes the same run."""
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "tokens").mkdir(exist_ok=True)
        (self.path / "images").mkdir(exist_ok=True)
        if self.header_path.exists():
            old = self.read_header()
            from .preflight import same_model

            diff = [k for k in IDENTITY_KEYS if old.get(k) != header.get(k)]
            detail = [f"{k}: {old.get(k)!r} -> {header.get(k)!r}" for k in diff]
            model_diff = same_model(old.get("model"), header.get("model")) if "model" in header else None
            if model_diff:
                detail.append(f"model: {model_diff}")
            if detail and not force:
                raise RunError(f"{self.path} holds a different run ({'; '.join(detail)}); use another --out or --force")
            hist = old.setdefault("resumed", [])
            hist.append({"at": time.time(), "argv": header.get("argv")})
            if len(hist) > RESUME_HISTORY:  # bounded: the first five resumes, a count, and the latest ones
                omitted = sum(h.get("omitted", 1) for h in hist[5:len(hist) - (RESUME_HISTORY - 6)])
                old["resumed"] = hist[:5] + [{"omitted": omitted}] + hist[-(RESUME_HISTORY - 6):]
            for k in ("selection",):
                if k in header:
                    old[k] = header[k]
            _atomic_write(self.header_path, json.dumps(old, indent=2, sort_keys=True).encode())
            return old
        _atomic_write(self.header_path, json.dumps(header, indent=2, sort_keys=True).encode())
        return header

    def note_skipped(self, skipped: list[tuple[str, str]]) -> None:
        """Record which samples a run left out (``--allow-missing-images``) and why."""
        _atomic_write(self.path / "skipped_samples.json",
                      json.dumps([{"sample_id": i, "reason": r} for i, r in skipped], indent=1).encode())

    def lock(self, *, wait_s: float = 30.0, shared_only: bool = False) -> None:
        """Hold the run lock for this process's lifetime: one runner (and its --processes) per directory.

        A runner takes it exclusively (waiting up to ``wait_s`` for a previous runner's processes to
        exit), then downgrades to shared so its own worker processes (``shared_only``) can join.
        """
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path / ".runner.lock", os.O_RDWR | os.O_CREAT, 0o644)
        if shared_only:
            fcntl.flock(fd, fcntl.LOCK_SH)
        else:
            deadline = time.time() + wait_s
            said = False
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.time() > deadline:
                        os.close(fd)
                        raise RunError(f"{self.path}: another runner is writing to this run directory") from None
                    if not said:
                        print(f"{self.path}: another runner holds this run directory; waiting up to {wait_s:g}s for "
                              "it to finish…", file=sys.stderr, flush=True)
                        said = True
                    time.sleep(0.2)
            fcntl.flock(fd, fcntl.LOCK_SH)
        self._lock_fd = fd

    def unlock(self) -> None:
        fd = getattr(self, "_lock_fd", None)
        if fd is not None:
            os.close(fd)
            self._lock_fd = None

    def read_header(self) -> dict:
        try:
            return json.loads(self.header_path.read_text())
        except FileNotFoundError:
            raise RunError(f"{self.path}: no header.json — not a run directory") from None
        except json.JSONDecodeError as e:
            raise RunError(f"{self.header_path}: unreadable header ({e})") from None

    # ------------------------------------------------------------------ lines
    def read_lines(self, *, warn=True) -> list[dict]:
        if not self.results.exists():
            return []
        out = []
        with open(self.results, "rb") as f:
            for n, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                try:
                    out.append(json.loads(raw))
                except json.JSONDecodeError:
                    if warn:
                        print(f"warning: {self.results}:{n}: torn or malformed line ignored "
                              f"(its sample will be rerun on resume)", file=sys.stderr)
        return out

    def latest(self) -> dict[tuple[str, int], dict]:
        """The last line of each (sample, trial), as its summary (the line without ``events`` and ``messages``;
        :meth:`Run.full` reads the whole line)."""
        out = {}
        for line in self.index():
            out[(line["sample_id"], int(line["trial"]))] = line
        return out

    # ------------------------------------------------------------------ the index (ours)
    # results.index.jsonl: one small entry per line of results.jsonl (its byte offset and length, and the
    # line without its events and messages), so that a run of thousands of ~150 KB lines is listed without
    # parsing them; the lines themselves are read one at a time when something needs them. The index is a
    # cache: the writer appends to it, and a reader checks it against results.jsonl and parses whatever it
    # does not cover (an older run, a crash between the two writes), rebuilding it when that is much.
    def index(self, *, warn: bool = True, verify: bool = True) -> list[dict]:
        """Summaries of every parseable line of results.jsonl in file order (with private ``_o``/``_n``/``_h``).

        ``verify``: each entry's checksum (``_h``, CRC-32 of its line's bytes) is checked against the file, so
        a line damaged in place (same inode, same length: a disk error) is parsed again — and, if it no longer
        parses, is a torn line like any other (its unit reruns on resume; nothing is graded or drawn from it).
        One sequential read of results.jsonl (~1 s per GB)."""
        if not self.results.exists():
            return []
        st = os.stat(self.results)
        size, ino = st.st_size, st.st_ino
        entries = self._read_index(size, ino)
        with open(self.results, "rb") as f:
            if entries and not _entries_fit(f, entries):
                entries = []
            if verify and entries:
                entries = _entries_intact(f, entries)
            out, pos, scanned = [], 0, 0
            for e in entries + [None]:
                end = e["_o"] if e is not None else size
                if end > pos:  # bytes no entry covers: parse the lines there
                    got, n = _scan(f, pos, end, self.results, warn)
                    out += got
                    scanned += n
                if e is not None:
                    out.append(e)
                    pos = e["_o"] + e["_n"]
        if scanned > (1 << 20) or (not entries and out):
            self._write_index(out, ino)
        return out

    @property
    def index_path(self) -> Path:
        return self.path / "results.index.jsonl"

    def _read_index(self, size: int, ino: int) -> list[dict]:
        try:
            raw = self.index_path.read_bytes()
        except OSError:
            return []
        lines = raw.split(b"\n")
        try:
            head = json.loads(lines[0])
            if head.get("index") != 1 or head.get("ino") != ino:
                return []
        except ValueError:
            return []
        out = []
        for raw_e in lines[1:]:
            if not raw_e.strip():
                continue
            try:
                e = json.loads(raw_e)
            except ValueError:
                continue  # a torn index entry: its line is parsed from results.jsonl instead
            if isinstance(e, dict) and isinstance(e.get("_o"), int) and e["_o"] + e.get("_n", 0) <= size:
                out.append(e)
        out.sort(key=lambda e: e["_o"])
        # overlapping entries mean the index is stale: start again
        if any(a["_o"] + a["_n"] > b["_o"] for a, b in zip(out, out[1:])):
            return []
        return out

    def _write_index(self, entries: list[dict], ino: int) -> None:
        try:
            data = dumps({"index": 1, "ino": ino}) + b"\n" + b"".join(dumps(e) + b"\n" for e in entries)
            _atomic_write(self.index_path, data)
        except (OSError, RunError):
            pass  # a cache: a read-only run directory is read without it

    def _append_index(self, line: dict, offset: int, length: int, crc: int | None = None) -> None:
        try:
            ino = os.stat(self.results).st_ino
            with open(self.index_path, "ab") as f:
                if f.tell() == 0:
                    f.write(dumps({"index": 1, "ino": ino}) + b"\n")
                f.write(dumps({**summary_of(line), "_o": offset, "_n": length, "_h": crc}) + b"\n")
        except OSError:
            pass  # the reader parses what the index lacks

    def done_keys(self, *, retry_errors: bool = False) -> set[tuple[str, int]]:
        return {k for k, line in self.latest().items() if not (retry_errors and line.get("status") in ("error", "timeout"))}

    def append(self, traj, line: dict) -> None:
        """Write the sidecar and images, then the line (one write; its presence means 'complete')."""
        # one sidecar per attempt: a later line for the same (sample, trial) (--retry-errors) never overwrites
        # the tokens of the line it supersedes
        key = f"{token_key(line['sample_id'], line['trial'])}__{uuid.uuid4().hex[:8]}"
        try:
            if traj.tokens:
                _atomic_write(self.path / "tokens" / f"{key}.parquet",
                              _encode_sidecar(traj.tokens, traj.top_k, self.token_precision))
                line["tokens_file"] = f"tokens/{key}.parquet"
            else:
                line["tokens_file"] = None
            for p in [*getattr(traj.sample, "image_paths", []), *getattr(traj, "image_files", {}).values()]:
                self.store_image(p)
            data = dumps(line) + b"\n"
            if b"\n" in data[:-1]:  # cannot happen with JSON, but a torn line must never be possible
                raise RunError("internal: a result line contains a newline")
            with open(self.results, "ab") as f:  # one write under an exclusive lock: --processes share the file
                fcntl.flock(f.fileno(), fcntl.LOCK_EX)
                try:
                    # a crash mid-write leaves a fragment without its newline: never glue a record onto it
                    size = os.fstat(f.fileno()).st_size
                    start = size
                    if size:
                        with open(self.results, "rb") as r:
                            r.seek(size - 1)
                            if r.read(1) != b"\n":
                                data = b"\n" + data
                                start += 1
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                    body = data[1:] if start > size else data
                    self._append_index(line, start, size + len(data) - start, zlib.crc32(body))
                finally:
                    fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        except OSError as e:  # disk full, permissions: a harness failure that names the file
            raise RunError(f"{getattr(e, 'filename', None) or self.path}: cannot write the run record "
                           f"({e.strerror or e}); finished lines are kept, rerun to resume") from e

    def store_image(self, path) -> str | None:
        from .backends.messages import ImageError, load_image

        try:
            img = load_image(path)
        except ImageError:
            return None
        ext = img.mime.split("/")[-1].replace("jpeg", "jpg")
        dst = self.path / "images" / f"{img.sha256}.{ext}"
        if not dst.exists():
            dst.parent.mkdir(exist_ok=True)
            tmp = _tmp_name(dst)
            shutil.copyfile(img.source, tmp)
            os.replace(tmp, dst)  # the same bytes under the same name: a concurrent writer does no harm
        return img.sha256


#: What a line's summary leaves out (the bulk of a line: its event list and its message table).
SUMMARY_DROP = ("events", "messages")


def summary_of(line: dict) -> dict:
    return {k: v for k, v in line.items() if k not in SUMMARY_DROP}


def _entries_fit(f, entries: list[dict]) -> bool:
    """Each entry's bytes still hold a line there: '{' at its start, a newline at its end and before it."""
    for e in entries:
        o, n = e["_o"], e["_n"]
        f.seek(max(0, o - 1))
        before = f.read(1) if o else b"\n"
        f.seek(o)
        first = f.read(1)
        f.seek(o + n - 1)
        last = f.read(1)
        if before != b"\n" or first != b"{" or last != b"\n":
            return False
    return True


def _entries_intact(f, entries: list[dict]) -> list[dict]:
    """The entries whose line bytes still have the checksum the index recorded (entries without one, from an
    older index, cannot be vouched for: their lines are parsed again)."""
    out = []
    for e in entries:
        h = e.get("_h")
        if h is None:
            continue
        f.seek(e["_o"])
        if zlib.crc32(f.read(e["_n"])) == h:
            out.append(e)
    return out


def _scan(f, start: int, end: int, path, warn: bool) -> tuple[list[dict], int]:
    """Parse the lines in bytes [start, end) of results.jsonl: (their summaries, bytes scanned)."""
    from .http import loads

    f.seek(start)
    out, pos = [], start
    while pos < end:
        raw = f.readline(max(1, end - pos))
        if not raw:
            break
        o, pos = pos, pos + len(raw)
        if not raw.strip():
            continue
        try:
            line = loads(raw) if raw.endswith(b"\n") else None
            if not isinstance(line, dict) or "sample_id" not in line or "trial" not in line:
                raise ValueError
        except ValueError:
            if warn:
                print(f"warning: {path}: torn or malformed line at byte {o} ignored "
                      f"(its sample will be rerun on resume)", file=sys.stderr)
            continue
        out.append({**summary_of(line), "_o": o, "_n": len(raw), "_h": zlib.crc32(raw)})
    return out, pos - start


class Lines(Sequence):
    """A run's latest lines, read from results.jsonl one at a time when accessed (nothing is kept):
    ``for line in run.lines`` holds one line in memory at a time; ``run.lines[i]`` parses line i."""

    def __init__(self, results: Path, index: list[dict]):
        self._results = results
        self._index = index

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._read(e) for e in self._index[i]]
        return self._read(self._index[i])

    def __iter__(self):
        from .http import loads

        with open(self._results, "rb") as f:
            for e in self._index:
                f.seek(e["_o"])
                yield _full(_checked(f.read(e["_n"]), e, self._results), e)

    def _read(self, e: dict) -> dict:
        with open(self._results, "rb") as f:
            f.seek(e["_o"])
            return _full(_checked(f.read(e["_n"]), e, self._results), e)


def _checked(raw: bytes, entry: dict, path) -> dict:
    """The line at an index entry, refused with the file and byte offset if it changed since it was indexed."""
    from .http import loads

    if entry.get("_h") is not None and zlib.crc32(raw) != entry["_h"]:
        raise RunError(f"{path}: the line at byte {entry['_o']} changed since the run was read (damaged on disk?); "
                       f"python -m agent.rundir check {Path(path).parent} reports it")
    try:
        return loads(raw)
    except ValueError as e:
        raise RunError(f"{path}: the line at byte {entry['_o']} does not parse ({e}); python -m agent.rundir check "
                       f"{Path(path).parent} reports it") from None


def _full(line: dict, entry: dict) -> dict:
    line["_o"], line["_n"] = entry["_o"], entry["_n"]
    return line


class Run:
    """A run directory opened for reading: ``header``, ``index`` (every latest line's summary: the line without
    its events and messages, kept in memory), ``lines`` (the whole lines, read on access, see :class:`Lines`)."""

    def __init__(self, path, header: dict, index: list[dict] | None = None, *, lines: list[dict] | None = None):
        self.path = Path(path)
        self.header = header
        if lines is not None:  # built in memory (tests, notebooks)
            self.index = [summary_of(ln) | {"_line": ln} for ln in lines]
            self._lines = list(lines)
        else:
            self.index = index or []
            self._lines = None

    @property
    def lines(self):
        if self._lines is not None:
            return self._lines
        return Lines(self.path / "results.jsonl", self.index)

    def full(self, line: dict) -> dict:
        """The whole line (events and messages) of a summary or a line."""
        if "events" in line or "messages" in line:
            return line
        if "_line" in line:
            return line["_line"]
        if "_o" not in line:
            raise RunError(f"{line.get('sample_id')}: not a line of {self.path}")
        return Lines(self.path / "results.jsonl", [line])[0]

    def samples(self):
        import pandas as pd

        keep = ("sample_id", "trial", "method", "variant", "benchmark", "category", "paper_category", "status",
                "answer", "gold", "error", "n_calls", "n_tool_calls", "generated_tokens", "think_tokens",
                "duration_s", "model")
        rows = []
        for ln in self.index:
            r = {k: ln.get(k) for k in keep}
            r["n_query_images"] = len(ln.get("query_images") or {})
            r["max_prompt_tokens"] = max((c["prompt_tokens"] for c in ln.get("calls", [])), default=0)
            r["total_tokens"] = sum(c["prompt_tokens"] + c["completion_tokens"] for c in ln.get("calls", []))
            r["length_calls"] = sum(c.get("finish_reason") == "length" for c in ln.get("calls", []))
            for name, n in (ln.get("tool_calls") or {}).items():
                r[f"tool_{name}"] = n
            rows.append(r)
        return pd.DataFrame(rows)

    def calls(self):
        import pandas as pd

        rows = []
        for ln in self.index:
            for c in ln.get("calls", []):
                rows.append({"sample_id": ln["sample_id"], "trial": ln["trial"], "method": ln["method"],
                             "variant": ln.get("variant", ""), "benchmark": ln["benchmark"],
                             "paper_category": ln.get("paper_category"), "status": ln["status"], **c})
        return pd.DataFrame(rows)

    def tokens(self, line: dict, columns: list[str] | None = None) -> dict[str, np.ndarray]:
        """The line's per-token arrays (``columns`` to read only some: the sidecar is columnar)."""
        if not line.get("tokens_file"):
            return {}
        p = self.path / line["tokens_file"]
        try:
            return _decode_sidecar(p, columns)
        except (OSError, ValueError) as e:
            raise RunError(f"{p}: unreadable token sidecar ({e})") from None

    def call_event(self, line: dict, call: int | dict) -> dict:
        """The ``llm_call`` event of ``call``: the event itself, or its 1-based call index."""
        if isinstance(call, dict):
            return call
        for ev in self.full(line).get("events") or []:
            if ev.get("type") == "llm_call" and ev.get("index") == call:
                return ev
        raise RunError(f"{line.get('sample_id')} trial {line.get('trial')}: no LLM call #{call} "
                       f"(it made {line.get('n_calls')})")

    def call_messages(self, line: dict, call: int | dict) -> list[dict]:
        """The exact messages of one call (the event, or its 1-based index)."""
        line = self.full(line)
        return [line["messages"][i] for i in self.call_event(line, call)["message_ids"]]

    def sendable_messages(self, line: dict, call_event: int | dict) -> list[dict]:
        """The call's messages ready to send again: each recorded image part points at the stored image."""
        out = []
        for m in self.call_messages(line, call_event):
            c = m.get("content")
            if isinstance(c, list):
                parts = []
                for p in c:
                    if isinstance(p, dict) and p.get("type") == "image":
                        if p.get("url"):
                            parts.append({"type": "image_url", "image_url": {"url": p["url"]}})
                            continue
                        path = self.image_path(p["sha256"])
                        if path is None:
                            raise RunError(f"{self.path}/images: image {p['sha256'][:12]}… of {line['sample_id']} "
                                           f"is not stored (was the run directory copied without images/?)")
                        # the hash rides along: removing query images never needs to read the file again
                        parts.append({"type": "image_url", "image_url": {"url": str(path)}, "sha256": p["sha256"]})
                    else:
                        parts.append(p)
                m = {**m, "content": parts}
            out.append(m)
        return out

    def image_path(self, sha256: str) -> Path | None:
        d = getattr(self, "_images", None)
        if d is None or sha256 not in d:  # listed once (and again when an image is not found: it may be new)
            d = self._images = {}
            if (self.path / "images").is_dir():
                for p in (self.path / "images").iterdir():
                    d.setdefault(p.name.split(".")[0], p)
        return d.get(sha256)


@contextlib.contextmanager
def output_lock(out_dir, what: str):
    """Hold ``out_dir``'s lock while a probe writes there: a second probe on the same directory is refused at
    once (two would append the same steps twice and change the statistics)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(out_dir / ".probe.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunError(f"{out_dir}: another {what} is writing here; wait for it to finish (or give another "
                           "--out)") from None
        yield
    finally:
        os.close(fd)


def close_fragment(path) -> None:
    """End an append-only JSONL file that an interrupted append left without its final newline, so the next
    append starts a line of its own (the fragment stays, unparseable, and is skipped by readers)."""
    try:
        with open(path, "rb+") as f:
            if f.seek(0, 2) and (f.seek(-1, 2), f.read(1))[1] != b"\n":
                f.write(b"\n")
    except FileNotFoundError:
        pass


_FROZEN = {"depth": 0}


@contextlib.contextmanager
def collector_off_the_heap():
    """Keep Python's cyclic garbage collector off everything alive now while a long loop reads many large lines.

    A probe or a report holds the run's index (thousands of line summaries) and its pending work while it
    parses one ~150 KB line after another; every full collection the new objects trigger walks all of that
    again, so the cost of each line grew with the size of the run (ours: measured with
    ``scripts/bench_entropy.py``). ``gc.freeze()`` moves what is alive into a generation the collector skips;
    leaving the block (outermost) puts it back. Inside, young collections wait for 100k allocations (instead of
    700), so a parsed line's objects are freed by reference counting before a collection walks them. Reference
    counting frees everything as before."""
    import gc

    _FROZEN["depth"] += 1
    if _FROZEN["depth"] == 1:
        # a process that froze its heap for good (python -m agent.run does) keeps it frozen afterwards
        _FROZEN["owner"] = gc.get_freeze_count() == 0
        _FROZEN["threshold"] = gc.get_threshold()
        gc.freeze()
        # a parsed line's objects die by reference counting before a young collection walks them
        gc.set_threshold(max(_FROZEN["threshold"][0], 100_000), *_FROZEN["threshold"][1:])
    try:
        yield
    finally:
        _FROZEN["depth"] -= 1
        if _FROZEN["depth"] == 0:
            gc.set_threshold(*_FROZEN.pop("threshold"))
            if _FROZEN.pop("owner", False):
                gc.unfreeze()


def load_run(path) -> Run:
    rd = RunDir(path)
    header = rd.read_header()
    return Run(rd.path, header, list(rd.latest().values()))  # summaries; whole lines are read on access


# ====================================================================== python -m agent.rundir check
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
    sidecars: list = field(default_factory=list)         # (sample_id/trial, problem)
    orphans: list = field(default_factory=list)          # token files no line names
    temp_files: list = field(default_factory=list)
    missing_images: list = field(default_factory=list)   # (sample_id/trial, sha256)
    cache: str = "absent"                                # "ok", "absent", or the integrity problem
    repaired: list = field(default_factory=list)

    @property
    def intact(self) -> bool:
        return not (self.torn or self.duplicates or self.sidecars or self.missing_images
                    or self.cache not in ("ok", "absent"))

    @property
    def complete(self) -> bool:
        return not self.missing and (self.expected is None or self.present >= self.expected)

    def lines(self) -> list[str]:
        out = [f"{self.path}: {'intact' if self.intact else 'DAMAGED'}, "
               f"{'complete' if self.complete else 'INCOMPLETE'}",
               f"  units: {self.present} present of {self.expected if self.expected is not None else '?'} expected "
               f"{dict(sorted(self.statuses.items()))}; {self.superseded} superseded by retries"]
        for name, items in (("missing units", self.missing), ("duplicated units", self.duplicates),
                            ("torn or unparseable lines", self.torn), ("sidecar problems", self.sidecars),
                            ("orphaned token files", self.orphans), ("temporary files", self.temp_files),
                            ("missing images", self.missing_images)):
            if items:
                shown = ", ".join(str(x) for x in items[:5])
                out.append(f"  {len(items)} {name}: {shown}{' …' if len(items) > 5 else ''}")
        out.append(f"  tool cache: {self.cache}")
        out += [f"  repaired: {r}" for r in self.repaired]
        return out

    def to_dict(self) -> dict:
        from dataclasses import asdict

        return {**asdict(self), "intact": self.intact, "complete": self.complete}


def _expected_keys(rd: "RunDir", header: dict) -> set | None:
    """The (sample, trial) units the run was asked for, from the manifest and the recorded selection."""
    sel = header.get("selection") or {}
    try:
        from .benchmarks import resolve_benchmark

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
    return {(s.id, t) for t in range(int(header.get("trials") or 1)) for s in samples if s.id not in skipped}


def check_run(path, *, deep: bool = True, repair: bool = False) -> CheckReport:
    """Is this run complete and intact? ``deep=False`` is the cheap part (lines, temp files) the runner
    runs on resume; ``repair`` quarantines torn lines and orphans (never deletes them) and removes temp files."""
    rd = RunDir(path)
    header = rd.read_header()
    rep = CheckReport(str(rd.path))
    good, torn_raw = [], []
    if rd.results.exists():
        with open(rd.results, "rb") as f:
            for n, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                try:
                    line = json.loads(raw)
                    if not isinstance(line, dict) or "sample_id" not in line or "trial" not in line:
                        raise ValueError("not a result line")
                    # keep the summary and the images the line needs, not the line: memory stays bounded
                    need = set((line.get("query_images") or {}).values())
                    need |= {h for e in line.get("events") or [] if e.get("type") == "tool_call"
                             for h in e.get("result_images") or []}
                    need |= {p.get("sha256") for m in line.get("messages") or [] if isinstance(m.get("content"), list)
                             for p in m["content"] if isinstance(p, dict) and p.get("type") == "image" and p.get("sha256")}
                    good.append({**summary_of(line), "_need": need})
                except ValueError:
                    rep.torn.append((n, raw[:60].decode(errors="replace")))
                    torn_raw.append(raw)
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
        sel = header.get("selection") or {}
        n = sel.get("n_samples")
        rep.expected = n * int(header.get("trials") or 1) if n is not None else None
    for d in (rd.path, rd.path / "tokens", rd.path / "images"):
        if d.is_dir():
            rep.temp_files += [str(p.relative_to(rd.path)) for p in d.iterdir() if ".tmp" in p.name]
    if deep:
        named = {ln.get("tokens_file") for ln in good if ln.get("tokens_file")}
        for key, ln in latest.items():
            tf = ln.get("tokens_file")
            want = {c["index"]: c.get("n_tokens", 0) for c in ln.get("calls") or []}
            if not tf:
                if any(want.values()):
                    rep.sidecars.append((f"{key[0]}/t{key[1]}", "tokens recorded but no sidecar named"))
                continue
            try:
                call = read_parquet(rd.path / tf, ["call"]).column("call").to_numpy()
            except Exception as e:  # noqa: BLE001 - any unreadable file is the finding
                rep.sidecars.append((f"{key[0]}/t{key[1]}", f"{tf} unreadable ({type(e).__name__})"))
                continue
            got = {int(c): int((call == c).sum()) for c in np.unique(call)}
            if {c: n for c, n in want.items() if n} != got:
                rep.sidecars.append((f"{key[0]}/t{key[1]}", f"{tf}: token counts per call {got} != calls {want}"))
        tok_dir = rd.path / "tokens"
        if tok_dir.is_dir():
            rep.orphans = sorted(f"tokens/{p.name}" for p in tok_dir.glob("*.parquet") if f"tokens/{p.name}" not in named)
        stored = {p.name.split(".")[0] for p in (rd.path / "images").glob("*")} if (rd.path / "images").is_dir() else set()
        for key, ln in latest.items():
            need = ln["_need"]
            rep.missing_images += [(f"{key[0]}/t{key[1]}", h[:12]) for h in sorted(need - stored)]
        cache = (header.get("tools") or {}).get("cache") or str(rd.path / "tools.sqlite")
        if Path(cache).exists():
            import sqlite3

            try:
                con = sqlite3.connect(f"file:{cache}?mode=ro", uri=True, timeout=30)
                res = con.execute("PRAGMA integrity_check").fetchall()
                con.close()
                rep.cache = "ok" if res == [("ok",)] else "; ".join(r[0] for r in res[:5])
            except sqlite3.Error as e:
                rep.cache = f"unreadable ({e})"
    if repair:
        _repair(rd, rep, torn_raw)
    return rep


def _repair(rd: "RunDir", rep: CheckReport, torn_raw: list) -> None:
    rd.lock(wait_s=0.5)  # no runner may append while results.jsonl is rewritten
    try:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        q = rd.path / "quarantine"
        if torn_raw:
            q.mkdir(exist_ok=True)
            (q / f"torn-lines-{stamp}.jsonl").write_bytes(b"".join(r if r.endswith(b"\n") else r + b"\n" for r in torn_raw))
            torn = set(torn_raw)
            tmp = _tmp_name(rd.results)
            with open(rd.results, "rb") as src, open(tmp, "wb") as dst:  # the intact lines, byte for byte
                for raw in src:
                    if raw.strip() and raw not in torn:
                        dst.write(raw if raw.endswith(b"\n") else raw + b"\n")
                dst.flush()
                os.fsync(dst.fileno())
            os.replace(tmp, rd.results)
            rd.index_path.unlink(missing_ok=True)  # its offsets describe the old file
            rep.repaired.append(f"{len(torn_raw)} torn line(s) moved to quarantine/torn-lines-{stamp}.jsonl")
            rep.torn = []
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


def main(argv=None) -> int:

    from .cli import HelpFormatter, make_parser

    ap = make_parser("python -m agent.rundir", "Run-directory tools: check is a run complete and intact.",
                     ["python -m agent.rundir check runs/react-27b", "python -m agent.rundir check runs/react-27b --repair"])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="is this run complete and intact? (exit 0 only when it is)",
                       formatter_class=HelpFormatter,
                       description="Units expected vs present, duplicates, torn lines, sidecars against their calls, "
                                   "orphaned and temporary files, missing images, the tool cache's integrity.",
                       epilog="examples:\n  python -m agent.rundir check runs/react-27b\n"
                              "  python -m agent.rundir check runs/react-27b --repair --json")
    c.add_argument("run_dir", help="a run directory of python -m agent.run")
    c.add_argument("--repair", action="store_true",
                   help="move torn lines and orphaned files into RUN_DIR/quarantine/ (never deleted), remove temp files")
    c.add_argument("--json", action="store_true", help="print the report as JSON")
    a = ap.parse_args(argv)
    try:
        rep = check_run(a.run_dir, repair=a.repair)
    except RunError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(rep.to_dict(), indent=1, default=str) if a.json else "\n".join(rep.lines()))
    if not rep.intact:
        print("damaged: python -m agent.rundir check RUN_DIR --repair quarantines torn lines and orphans; "
              "rerun the run command to redo the units they held", file=sys.stderr)
    elif not a.json:
        from .cli import done

        done([f"{a.run_dir}/quarantine/"] if a.repair else [],
             f"python -m agent.show {a.run_dir}" if rep.complete else
             "rerun the run's command (python -m agent.run ... with the same --out) to finish the missing units")
    return 0 if rep.intact and rep.complete else 1


if __name__ == "__main__":
    sys.exit(main())
