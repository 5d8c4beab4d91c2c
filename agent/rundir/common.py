"""What every part of a run directory shares: the error, the identity keys, atomic writes and the locks."""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata as md
import json
import os
import platform
import re
import threading
from pathlib import Path

from ..errors import UsageError
from ..paths import inside as _inside
from ..redact import redact_obj

#: How the top-k logprobs are stored. float32 (default) keeps the server's values; float16 takes about two
#: thirds of the bytes and moves the grouped entropy by up to ~1e-3 nats. The sampled token's logprob and the
#: exact entropy are always float32.
TOKEN_PRECISIONS = ("float32", "float16")

#: How many resumes header.json remembers (the first five and the latest ones).
RESUME_HISTORY = 50

#: Header fields that must match when a run directory is resumed.
IDENTITY_KEYS = ("method", "variant", "benchmark", "remove_images_from_step", "budgets", "sampling", "schema_version",
                 "history_reasoning", "observation_images", "shard", "protocol")


class RunError(UsageError, RuntimeError):
    """A run directory that cannot be used as asked (foreign header, unreadable file)."""

    line_written = False  # a failed append whose result line landed all the same (only its index entry failed)


def inside(root, name, where: str) -> Path:
    """``root / name`` checked to stay inside ``root`` (agent/paths.py), or a :class:`RunError` naming ``where``."""
    return _inside(root, name, where, RunError)


def versions() -> dict:
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


def tmp_name(path: Path) -> Path:
    """A temporary sibling unique to this process and thread (appends may run in worker threads)."""
    return path.with_name(f"{path.name}.tmp{os.getpid()}-{threading.get_ident()}")


def atomic_write(path: Path, data: bytes) -> None:
    """``data`` into ``path`` under a temporary name, renamed into place (a reader sees the old file or the new,
    never a part). The bytes are written as given: records are redacted before they are serialised."""
    tmp = tmp_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk, an interrupt: no temporary left behind (one a kill leaves is swept on resume)
        tmp.unlink(missing_ok=True)
        raise


_TMP = re.compile(r"\.tmp(\d+)-\d+$")


def stale_temporaries(d: Path) -> list[Path]:
    """The temporaries of :func:`tmp_name` in directory ``d`` whose writer process is gone (killed mid-write)."""
    out = []
    for p in d.iterdir() if d.is_dir() else ():
        m = _TMP.search(p.name)
        if m and int(m.group(1)) != os.getpid() and not _alive(int(m.group(1))):
            out.append(p)
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def write_json(path, obj, **kw) -> None:
    """``obj`` as JSON text (``json.dumps(obj, **kw)``) into ``path``, its strings redacted first
    (agent/redact.py), under a temporary name, renamed."""
    atomic_write(Path(path), json.dumps(redact_obj(obj), **kw).encode())


@contextlib.contextmanager
def output_lock(out_dir, what: str, name: str = ".probe.lock"):
    """Hold ``out_dir``'s lock (the file ``name`` in it) while a command writes there: a second one on the same
    directory is refused at once (two probes would append the same steps twice, two judges pay for every grade
    twice, two merges build the same directory)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(out_dir / name, os.O_RDWR | os.O_CREAT, 0o644)
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
