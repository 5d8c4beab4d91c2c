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

import fcntl
import hashlib
import json
import os
import re
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .http import dumps

__all__ = ["RunDir", "Run", "load_run", "RunError", "IDENTITY_KEYS", "versions", "token_key", "read_parquet",
           "TOKEN_PRECISIONS"]

#: How the top-k logprobs are stored. float32 (default) keeps the server's values; with zstd and
#: byte-stream-split it takes ~94 bytes per generated token with top-20 ids and logprobs over a 248k
#: vocabulary (scripts/bench_runner.py). float16 takes ~60 and moves the grouped entropy by <= 1e-3
#: nats (mean ~2e-4). The sampled token's logprob and the exact entropy are always float32.
TOKEN_PRECISIONS = ("float32", "float16")

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


def read_parquet(path, columns: list[str] | None = None):
    """Read a Parquet file single-threaded.

    pyarrow's threaded reader (``pq.read_table``) intermittently aborts the interpreter at exit
    ("terminate called without an active exception", apache/arrow#34314; seen here with 26.0.1).
    """
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).read(columns=columns, use_threads=False)


def _token_table(tokens: dict[int, dict[str, np.ndarray]], k: int, precision: str = "float32"):
    import pyarrow as pa

    calls = sorted(tokens)
    n = sum(len(tokens[c]["id"]) for c in calls)
    k = max(int(k), 1)

    def cat(name, dtype, shape=()):
        parts = [tokens[c][name] for c in calls]
        return np.concatenate(parts).astype(dtype) if parts else np.zeros((0, *shape), dtype=dtype)

    def fixed(name, dtype, fill):
        arr = np.full((n, k), fill, dtype=dtype)
        row = 0
        for c in calls:
            a = tokens[c][name]
            arr[row: row + len(a), : min(k, a.shape[1] if a.ndim == 2 else 0)] = a[:, :k]
            row += len(a)
        return pa.FixedSizeListArray.from_arrays(pa.array(arr.reshape(-1)), k)

    call_col = np.concatenate([np.full(len(tokens[c]["id"]), c, dtype=np.int16) for c in calls]) if calls else np.zeros(0, np.int16)
    pos_col = np.concatenate([np.arange(len(tokens[c]["id"]), dtype=np.int32) for c in calls]) if calls else np.zeros(0, np.int32)
    return pa.table({
        "call": call_col, "pos": pos_col, "id": cat("id", np.int32), "logprob": cat("logprob", np.float32),
        "think": cat("think", bool), "top_ids": fixed("top_ids", np.int32, -1),
        "top_logprobs": fixed("top_logprobs", np.float16 if precision == "float16" else np.float32, np.nan),
        "exact_entropy": cat("exact_entropy", np.float32),
    })


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
            old.setdefault("resumed", []).append({"at": time.time(), "argv": header.get("argv")})
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
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.time() > deadline:
                        os.close(fd)
                        raise RunError(f"{self.path}: another runner is writing to this run directory") from None
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
        out = {}
        for line in self.read_lines():
            out[(line["sample_id"], int(line["trial"]))] = line
        return out

    def done_keys(self, *, retry_errors: bool = False) -> set[tuple[str, int]]:
        return {k for k, line in self.latest().items() if not (retry_errors and line.get("status") in ("error", "timeout"))}

    def append(self, traj, line: dict) -> None:
        """Write the sidecar and images, then the line (one write; its presence means 'complete')."""
        import pyarrow.parquet as pq
        import io

        key = token_key(line["sample_id"], line["trial"])
        if traj.tokens:
            buf = io.BytesIO()
            pq.write_table(_token_table(traj.tokens, traj.top_k, self.token_precision), buf, compression="zstd",
                           use_byte_stream_split=["logprob", "top_logprobs.list.element", "exact_entropy"],
                           use_dictionary=False)
            _atomic_write(self.path / "tokens" / f"{key}.parquet", buf.getvalue())
            line["tokens_file"] = f"tokens/{key}.parquet"
        else:
            line["tokens_file"] = None
        for p in [*getattr(traj.sample, "image_paths", []), *getattr(traj, "image_files", {}).values()]:
            self.store_image(p)
        data = dumps(line) + b"\n"
        if b"\n" in data[:-1]:  # cannot happen with json.dumps, but a torn line must never be possible
            raise RunError("internal: a result line contains a newline")
        with open(self.results, "ab") as f:  # one write under an exclusive lock: --processes share the file
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

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


@dataclass
class Run:
    path: Path
    header: dict
    lines: list[dict] = field(default_factory=list)

    def samples(self):
        import pandas as pd

        keep = ("sample_id", "trial", "method", "variant", "benchmark", "category", "paper_category", "status",
                "answer", "gold", "error", "n_calls", "n_tool_calls", "generated_tokens", "think_tokens",
                "duration_s", "model")
        rows = []
        for ln in self.lines:
            r = {k: ln.get(k) for k in keep}
            r["n_query_images"] = len(ln.get("query_images") or {})
            r["max_prompt_tokens"] = max((c["prompt_tokens"] for c in ln.get("calls", [])), default=0)
            r["total_tokens"] = sum(c["prompt_tokens"] + c["completion_tokens"] for c in ln.get("calls", []))
            for name, n in (ln.get("tool_calls") or {}).items():
                r[f"tool_{name}"] = n
            rows.append(r)
        return pd.DataFrame(rows)

    def calls(self):
        import pandas as pd

        rows = []
        for ln in self.lines:
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
            t = read_parquet(p, columns)
        except (OSError, ValueError) as e:
            raise RunError(f"{p}: unreadable token sidecar ({e})") from None
        out = {}
        for name in t.column_names:
            col = t.column(name).combine_chunks()
            if name in ("top_ids", "top_logprobs"):
                k = col.type.list_size
                arr = col.flatten().to_numpy(zero_copy_only=False).reshape(-1, k)
                out[name] = arr.astype(np.float32) if arr.dtype == np.float16 else arr
            else:
                out[name] = col.to_numpy(zero_copy_only=False)
        return out

    def call_messages(self, line: dict, call_event: dict) -> list[dict]:
        return [line["messages"][i] for i in call_event["message_ids"]]

    def sendable_messages(self, line: dict, call_event: dict) -> list[dict]:
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
                        parts.append({"type": "image_url", "image_url": {"url": str(path)}})
                    else:
                        parts.append(p)
                m = {**m, "content": parts}
            out.append(m)
        return out

    def image_path(self, sha256: str) -> Path | None:
        hits = list((self.path / "images").glob(f"{sha256}.*"))
        return hits[0] if hits else None


def load_run(path) -> Run:
    rd = RunDir(path)
    header = rd.read_header()
    return Run(rd.path, header, list(rd.latest().values()))
