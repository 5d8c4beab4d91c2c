"""Writing a run directory: the header (identity checked on resume), the run lock, the one-write append of a
finished line (sidecar and images first), the image store."""
from __future__ import annotations

import fcntl
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from ..identity import same_model, server_differences, unverified_facts
from ..images import ImageError, load_image
from ..record import validate
from .common import (
    IDENTITY_KEYS,
    RESUME_HISTORY,
    TOKEN_PRECISIONS,
    RunError,
    atomic_write,
    stale_temporaries,
    tmp_name,
    token_key,
    write_json,
)
from .index import RunIndex, read_header
from .lines import line_digest, seal
from .sidecar import encode as _encode_sidecar
from .sidecar import sha256_of

log = logging.getLogger(__name__)


@dataclass
class RunDir(RunIndex):
    path: Path
    token_precision: str = "float32"
    _lock_fd: int | None = field(default=None, init=False, repr=False)  # the run lock, while held

    def __post_init__(self):
        if self.token_precision not in TOKEN_PRECISIONS:
            raise ValueError(f"token precision must be one of {TOKEN_PRECISIONS}, got {self.token_precision!r}")
        self.path = Path(self.path)
        if self.path.exists() and not self.path.is_dir():
            raise RunError(f"{self.path} is a file, not a run directory (give a directory, new or of a run)")
        self.results = self.path / "results.jsonl"
        self.header_path = self.path / "header.json"

    # ------------------------------------------------------------------ header
    def write_header(self, header: dict, *, force: bool = False, allow_unverified: bool = False) -> dict:
        """Write the header, or check that an existing one describes the same run. A directory holding another run
        is refused; with ``force`` it is moved aside (:meth:`move_aside`, the new name printed) and this run starts
        afresh: no line of one configuration is ever counted as done for another. A server that cannot say the facts
        the run recorded (:func:`agent.preflight.unverified_facts`) is a difference too, unless ``allow_unverified``:
        then the resume goes on, and the header's ``resumed`` entry says so."""
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "tokens").mkdir(exist_ok=True)
        (self.path / "images").mkdir(exist_ok=True)
        if self.header_path.exists():
            old = self.read_header()
            detail = _differences(old, header, allow_unverified)
            if detail and not force:
                unverified = unverified_facts(old.get("model"), header.get("model"))
                hint = (" (if you know the server computes as when the run was recorded, --allow-unverified-server "
                        "resumes and records that in header.json)") if unverified else ""
                raise RunError(f"{self.path} holds a different run ({'; '.join(detail)}); give another --out, or "
                               "--force to move that run aside (renamed, never deleted) and start this one afresh"
                               + hint)
            if detail:
                aside = self.move_aside()
                log.info(f"--force: {self.path} held a different run ({'; '.join(detail)}); it was moved to {aside}, "
                         "and this run starts afresh")
                return self.write_header(header)
            hist = old.setdefault("resumed", [])
            hist.append({"at": time.time(), "argv": header.get("argv")})
            unverified = unverified_facts(old.get("model"), header.get("model"))
            if unverified:  # allowed (else refused above): the record says this resume could not be verified
                hist[-1]["unverified_server"] = unverified
                log.warning(f"WARNING: {self.path}: {unverified}; resumed with --allow-unverified-server (recorded in "
                            "header.json)")
            validate("header", old, str(self.header_path))
            if len(hist) > RESUME_HISTORY:  # bounded: the first five resumes, a count, and the latest ones
                omitted = sum(h.get("omitted", 1) for h in hist[5:len(hist) - (RESUME_HISTORY - 6)])
                old["resumed"] = hist[:5] + [{"omitted": omitted}] + hist[-(RESUME_HISTORY - 6):]
            for k in ("selection",):
                if k in header:
                    old[k] = header[k]
            write_json(self.header_path, old, indent=2, sort_keys=True)
            return old
        validate("header", header, str(self.header_path))
        write_json(self.header_path, header, indent=2, sort_keys=True)
        return header

    def move_aside(self) -> Path:
        """Rename this directory to ``<name>.replaced-<UTC time>`` (never deleted) and start an empty one in its
        place; the run lock, if held, moves to the new directory. Returns the new name of the old run."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        aside = self.path.with_name(f"{self.path.name}.replaced-{stamp}")
        n = 1
        while aside.exists():
            n += 1
            aside = self.path.with_name(f"{self.path.name}.replaced-{stamp}-{n}")
        held = self._lock_fd is not None
        os.rename(self.path, aside)
        self.unlock()
        self.path.mkdir(parents=True)
        if held:
            self.lock(wait_s=0)
        return aside

    def sweep_temporaries(self) -> int:
        """Remove the temporaries a killed writer left in the run's own folders (its pid is gone); how many. Run by
        the runner before it resumes, holding the run lock."""
        stale = [p for d in (self.path, self.path / "tokens", self.path / "images") for p in stale_temporaries(d)]
        for p in stale:
            p.unlink(missing_ok=True)
        return len(stale)

    def note_skipped(self, skipped: list[tuple[str, str]]) -> None:
        """Record which samples a run left out (``--allow-missing-images``) and why."""
        write_json(self.path / "skipped_samples.json", [{"sample_id": i, "reason": r} for i, r in skipped], indent=1)

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
                        log.info(f"{self.path}: another runner holds this run directory; waiting up to {wait_s:g}s for "
                                 "it to finish…")
                        said = True
                    time.sleep(0.2)
            fcntl.flock(fd, fcntl.LOCK_SH)
        self._lock_fd = fd

    def discard_if_unused(self) -> bool:
        """Remove this directory when it holds nothing but the run lock (a run refused before its header was
        written); whether it was removed."""
        try:
            if {p.name for p in self.path.iterdir()} - {".runner.lock"}:
                return False
            self.unlock()
            (self.path / ".runner.lock").unlink(missing_ok=True)
            self.path.rmdir()
            return True
        except OSError:
            return False

    def unlock(self) -> None:
        fd = self._lock_fd
        if fd is not None:
            os.close(fd)
            self._lock_fd = None

    def read_header(self) -> dict:
        """The header as written (a dict: the writer extends it on resume and merge), checked against its model;
        readers take :func:`agent.rundir.load_run`'s ``header``."""
        return read_header(self.path)[0]

    # ------------------------------------------------------------------ lines
    def done_keys(self, *, retry_errors: bool = False) -> set[tuple[str, int]]:
        return {k for k, line in self.latest().items() if not (retry_errors and line.get("status") in ("error", "timeout"))}

    def append(self, traj, line: dict) -> None:
        """Write the sidecar and images, then the line (one write; its presence means 'complete')."""
        # one sidecar per attempt: a later line for the same (sample, trial) (--retry-errors) never overwrites
        # the tokens of the line it supersedes
        key = f"{token_key(line['sample_id'], line['trial'])}__{uuid.uuid4().hex[:8]}"
        sidecar = self.path / "tokens" / f"{key}.parquet"
        try:
            if traj.tokens:
                prompt = (traj.tokenizer, traj.prompt_pieces) if getattr(traj, "prompt_pieces", None) else None
                data = _encode_sidecar(traj.tokens, traj.top_k, self.token_precision, prompt)
                atomic_write(sidecar, data)
                line["tokens_file"], line["tokens_sha256"] = f"tokens/{key}.parquet", sha256_of(data)
            else:
                line["tokens_file"] = line["tokens_sha256"] = None
            for p in [*getattr(traj.sample, "image_paths", []), *getattr(traj, "image_files", {}).values()]:
                self.store_image(p)
            self.append_line(line)
        except BaseException as e:
            if not (isinstance(e, RunError) and e.line_written):  # no line names it (a torn one is set aside): no orphan
                sidecar.unlink(missing_ok=True)
            if isinstance(e, OSError):  # disk full, permissions: a harness failure that names the file
                raise RunError(f"{getattr(e, 'filename', None) or self.path}: cannot write the run record "
                               f"({e.strerror or e}); finished lines are kept, rerun to resume") from e
            raise

    def append_line(self, line: dict) -> None:
        """Append one complete line (its sidecar and images already in place) and its index entry: one write
        under an exclusive lock."""
        validate("result", line, f"{self.results} ({line.get('sample_id')} trial {line.get('trial')})")
        end = None  # the file's size once the line is in it
        try:
            data = seal(line) + b"\n"
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
                    end = size + len(data)
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                    body = data[1:] if start > size else data
                    self._append_index(line, start, size + len(data) - start, line_digest(body) or "")
                finally:
                    fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        except OSError as e:  # disk full, permissions: a harness failure that names the file
            err = RunError(f"{getattr(e, 'filename', None) or self.path}: cannot write the run record "
                           f"({e.strerror or e}); finished lines are kept, rerun to resume")
            err.line_written = end is not None and self.results.stat().st_size >= end  # only its index entry failed
            raise err from e

    def store_image(self, path) -> str | None:
        try:
            img = load_image(path)
        except ImageError:
            return None
        ext = img.mime.split("/")[-1].replace("jpeg", "jpg")
        dst = self.path / "images" / f"{img.sha256}.{ext}"
        if not dst.exists():
            dst.parent.mkdir(exist_ok=True)
            tmp = tmp_name(dst)
            try:
                shutil.copyfile(img.source, tmp)
                os.replace(tmp, dst)  # the same bytes under the same name: a concurrent writer does no harm
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
        return img.sha256


def _differences(old: dict, new: dict, unverified_ok: bool = False) -> list[str]:
    """How the run recorded in ``old`` differs from the one ``new`` describes, in what makes them different runs."""
    diff = [k for k in IDENTITY_KEYS if old.get(k) != new.get(k)]
    detail = [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in diff]
    model_diff = same_model(old.get("model"), new.get("model")) if "model" in new else None
    if model_diff:
        detail.append(f"model: {model_diff}")
    modes = [(h.get("backend") or {}).get("logprob_mode") for h in (old, new)]
    if None not in modes and modes[0] != modes[1]:  # raw and scaled logprobs differ at T != 1
        detail.append(f"logprob mode: {modes[0]} -> {modes[1]}")
    server_diff = server_differences(old.get("model"), new.get("model"), unverified_ok=unverified_ok)
    if server_diff:  # one run, one server configuration: its lines are pooled in every table
        detail.append(server_diff)
    return detail
