"""What every part of a run directory shares: the error, the identity keys, atomic writes, the locks
and the garbage-collector setting of the readers."""
from __future__ import annotations

import contextlib
import fcntl
import gc
import hashlib
import importlib.metadata as md
import os
import platform
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


def _libc():
    try:
        import ctypes
        import ctypes.util

        name = ctypes.util.find_library("c")
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def _malloc_trim():
    """glibc's ``malloc_trim(0)`` (None elsewhere): hand the freed pages inside the heap back to the kernel."""
    import ctypes

    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


_TRIM = _malloc_trim()
#: glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: Where a long loop's blocks come from (:func:`keep_freed_pages`): every block below this from the heap.
MMAP_THRESHOLD = 32 << 20
#: How far a long loop's RSS may grow above its last trimmed level before :func:`collect_cycles` trims again.
TRIM_SLACK = 128 << 20


def keep_freed_pages() -> bool:
    """Tune glibc's allocator for a probe's loop (a CLI process; glibc only, else nothing; True when done): blocks
    up to :data:`MMAP_THRESHOLD` come from the heap and freed pages stay in it (no automatic trim at its top), so
    the ~1 MB of request bodies, replies and arrays a probed step allocates and frees reuses pages the process
    already has instead of mapping fresh ones (each first touch a page fault: the kernel zeroes the page). The heap
    is trimmed by :func:`collect_cycles` instead, when the RSS has grown by :data:`TRIM_SLACK`, so memory stays
    bounded. Ours, scripts/bench_probe_http.py --mode teacher-forced --scales 10,300 --no-breakdown, four rounds
    in turn with the code before: minor page faults ~460 -> ~80 a step, client CPU median 12.9 -> 11.4 ms a step
    (marginal, 100 to 3,000 steps; per-round ratios 0.76-0.93); peak RSS 564-593 -> 707-723 MB at 3,000 steps,
    771 MB at 10,000 (bounded by the slack)."""
    import ctypes

    mallopt = getattr(_libc(), "mallopt", None) if _TRIM is not None else None
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # a fixed threshold turns off glibc's own moving one (which follows the largest block freed so far)
    ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(_M_TRIM_THRESHOLD, 1 << 30)
    _FROZEN["keep"] = bool(ok)
    return bool(ok)


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def collect_cycles(every: int = 128, trim_every: int = 32) -> None:
    """Call once per unit of work (a probe's step) inside :func:`collector_off_the_heap`: every ``every`` calls
    a full collection runs. With the heap frozen it walks only what was made since (the work in flight), so it
    is cheap; without it the garbage that sits in reference cycles (an HTTP client's finished responses)
    waited for the rare full collections of the raised thresholds: +0.4 GB of RSS at 1,000 probed steps of
    ~1,000-token replies with httpx, gone with one collection every 32 steps (ours: scripts/bench_probe_http.py).
    With the model backends on aiohttp a step leaves ~80 objects in cycles, so one collection every 128 steps
    holds the same peak RSS (570 MB at 1,000 teacher-forced steps either way) for a quarter of the walks, each of
    which visits every object of the 64-128 trajectories in flight (~14 ms).

    On glibc, ``malloc_trim(0)``: a probe frees a ~1 MB reply body, its token lists and arrays at every step, and
    glibc keeps such freed blocks inside its heap, fragmented: the teacher-forced probe's RSS climbed by ~0.25 MB
    per step untrimmed (784 MB peak at 1,000 steps, 1.1 GB at 3,000); trimmed every 32 steps, 500 MB at 1,000
    (ours, scripts/bench_probe_http.py --mode teacher-forced; ~1 ms per trim). Each trim hands back every freed
    page, which the next steps fault in again, so after :func:`keep_freed_pages` the heap is trimmed only when the
    RSS (read every ``trim_every`` calls) has grown by :data:`TRIM_SLACK` since the last trim (ours): the same
    bound, a trim every few thousand steps instead of every 32."""

    _FROZEN["ticks"] = t = _FROZEN.get("ticks", 0) + 1
    if _FROZEN["depth"] > 0:
        if t % every == 0:
            gc.collect()
        if _TRIM is not None and t % trim_every == 0:
            if not _FROZEN.get("keep"):
                _TRIM(0)
                return
            rss = _rss_bytes()
            floor = _FROZEN.setdefault("rss_floor", rss)
            if rss is None or floor is None or rss > floor + TRIM_SLACK:
                _TRIM(0)
                _FROZEN["rss_floor"] = _rss_bytes()


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
