"""What every part of a run directory shares: the error, the identity keys, atomic writes, the locks
and the garbage-collector setting of the readers."""
from __future__ import annotations


import contextlib
import fcntl
import hashlib
import os
import re
import threading
from pathlib import Path


#: How the top-k logprobs are stored. float32 (default) keeps the server's values; with zstd and
#: byte-stream-split it takes ~94 bytes per generated token with top-20 ids and logprobs over a 248k
#: vocabulary (scripts/bench_runner.py). float16 takes ~60 and moves the grouped entropy by <= 1e-3
#: nats (mean ~2e-4). The sampled token's logprob and the exact entropy are always float32.
TOKEN_PRECISIONS = ("float32", "float16")

#: How many resumes header.json remembers (the first five and the latest ones).
RESUME_HISTORY = 50

#: Header fields that must match when a run directory is resumed.
IDENTITY_KEYS = ("method", "variant", "benchmark", "remove_images_from_step", "budgets", "sampling", "schema_version",
                 "history_reasoning", "observation_images", "shard")


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


def _malloc_trim():
    """glibc's ``malloc_trim(0)`` (None elsewhere): hand the freed pages inside the heap back to the kernel."""
    try:
        import ctypes
        import ctypes.util

        name = ctypes.util.find_library("c")
        lib = ctypes.CDLL(name) if name else None
        trim = getattr(lib, "malloc_trim", None)
        if trim is not None:
            trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
        return trim
    except (OSError, AttributeError):
        return None


_TRIM = _malloc_trim()


def collect_cycles(every: int = 128, trim_every: int = 32) -> None:
    """Call once per unit of work (a probe's step) inside :func:`collector_off_the_heap`: every ``every`` calls
    a full collection runs. With the heap frozen it walks only what was made since (the work in flight), so it
    is cheap; without it the garbage that sits in reference cycles (an HTTP client's finished responses)
    waited for the rare full collections of the raised thresholds: +0.4 GB of RSS at 1,000 probed steps of
    ~1,000-token replies with httpx, gone with one collection every 32 steps (ours: scripts/bench_probe_http.py).
    With the model backends on aiohttp a step leaves ~80 objects in cycles, so one collection every 128 steps
    holds the same peak RSS (570 MB at 1,000 teacher-forced steps either way) for a quarter of the walks, each of
    which visits every object of the 64-128 trajectories in flight (~14 ms).

    Every ``trim_every`` calls, on glibc, ``malloc_trim(0)``: a probe frees a ~1 MB reply body, its token lists and
    arrays at every step, and glibc keeps such freed blocks inside its heap (after the first free of a large block
    it raises its mmap threshold, so later ones come from the heap and fragment it): the teacher-forced probe's RSS
    climbed by ~0.25 MB per step (784 MB peak at 1,000 steps, 1.1 GB at 3,000) with the Python heap flat; trimmed
    every 32 steps, 500 MB at 1,000 (ours, scripts/bench_probe_http.py --mode teacher-forced; ~1 ms per trim)."""
    import gc

    _FROZEN["ticks"] = t = _FROZEN.get("ticks", 0) + 1
    if _FROZEN["depth"] > 0:
        if t % every == 0:
            gc.collect()
        if _TRIM is not None and t % trim_every == 0:
            _TRIM(0)


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
