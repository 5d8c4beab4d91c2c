"""What the launcher recorded about an endpoint: the GPUs behind a URL, for what a probe or a run costs.

    gpus_behind("http://gpu-node:30000")        # 4 (a TP=4 server), or a router's worker group size; None: unknown
    gpus_behind(url, serving_dir="/shared/.serve")  # read that launcher --serve-dir's endpoints.json

``python -m serving.launch`` writes ``endpoints.json`` in its ``--serve-dir`` (per URL: ``gpus`` "0,1,2,3",
``kind`` server / router, ``router_of`` the workers) and remembers the directory (serving/launch.py's
``state_file``). A URL is looked up there, in the given ``serving_dir`` first; a router counts the GPUs of one
of its workers (a request runs on one worker group). Nothing found: None, and callers say "unknown"
(never 0).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["gpus_behind", "gpus_held", "launched_endpoints", "launched_logprob_mode", "state_file", "remember",
           "write_endpoints"]


def state_file() -> Path:
    base = os.environ.get("MMCF_STATE_DIR") or os.path.join(
        os.environ.get("XDG_STATE_HOME", os.path.expanduser("~/.local/state")), "mmcf-toolkit")
    return Path(base) / "serve-dirs.txt"


def remember(run_dir: Path) -> None:
    f = state_file()
    try:
        f.parent.mkdir(parents=True, exist_ok=True)
        known = set(f.read_text().split("\n")) if f.exists() else set()
        if str(run_dir) not in known:
            with open(f, "a") as fh:
                fh.write(str(run_dir) + "\n")
    except OSError:
        pass  # remembering is a convenience for stop.sh, never a reason to fail


def write_endpoints(run_dir: Path, entries: list[dict]) -> None:
    tmp = run_dir / "endpoints.json.tmp"
    tmp.write_text(json.dumps(entries, indent=2))
    os.replace(tmp, run_dir / "endpoints.json")


def _norm(url: str) -> str:
    u = str(url).rstrip("/")
    for suffix in ("/generate", "/v1/chat/completions", "/v1"):
        u = u.removesuffix(suffix)
    return u.replace("://localhost", "://127.0.0.1")


def launched_endpoints(serving_dir=None) -> list[dict]:
    """Every entry of the launcher's endpoints.json files: ``serving_dir``'s, then the remembered directories'."""

    dirs = [Path(serving_dir)] if serving_dir else []
    try:
        dirs += [Path(x) for x in state_file().read_text().split("\n") if x.strip()]
    except OSError:
        pass
    out = []
    for d in dict.fromkeys(dirs):
        try:
            entries = json.loads((d / "endpoints.json").read_text())
        except (OSError, ValueError):
            continue
        out += [e for e in entries if isinstance(e, dict) and e.get("url")]
    return out


def _count(gpus) -> int | None:
    if isinstance(gpus, int):
        return gpus or None
    ids = [g for g in str(gpus or "").split(",") if g.strip()]
    return len(ids) or None


def _by_url(serving_dir) -> dict:
    by_url: dict = {}
    for e in launched_endpoints(serving_dir):  # a running entry over a stopped one left by an earlier launch
        k = _norm(e["url"])
        if k not in by_url or (by_url[k].get("status") == "stopped" and e.get("status") != "stopped"):
            by_url[k] = e
    return by_url


def gpus_held(url: str, serving_dir=None) -> int | None:
    """The GPUs held behind ``url``: a server's own, a router's all its workers' (what a run through it reserves,
    where :func:`gpus_behind` is what one request runs on); None when any is unknown."""
    by_url = _by_url(serving_dir)
    e = by_url.get(_norm(url))
    if e is None:
        return None
    if e.get("kind") == "router":
        counts = [_count((by_url.get(_norm(w)) or {}).get("gpus")) for w in e.get("router_of") or []]
        return sum(counts) if counts and all(c is not None for c in counts) else None
    return _count(e.get("gpus"))


def gpus_behind(url: str, serving_dir=None) -> int | None:
    """The number of GPUs one request to ``url`` runs on, from the launcher's record; None when unknown."""
    by_url = _by_url(serving_dir)
    e = by_url.get(_norm(url))
    if e is None:
        return None
    if e.get("kind") == "router":
        counts = {_count((by_url.get(_norm(w)) or {}).get("gpus")) for w in e.get("router_of") or []}
        return counts.pop() if len(counts) == 1 else None  # unknown or unequal worker groups: no single number
    return _count(e.get("gpus"))


def launched_logprob_mode(url: str, serving_dir=None) -> str | None:
    """What the launcher started the server behind ``url`` with: ``raw`` (``SGLANG_RETURN_ORIGINAL_LOGPROB=1``) or
    ``scaled``; a router's, when all its workers agree. None when the launcher did not start it (a server started
    elsewhere: its mode cannot be told from ``/server_info``)."""
    by_url = _by_url(serving_dir)
    e = by_url.get(_norm(url))
    if e is None:
        return None
    if e.get("kind") == "router":
        modes = {(by_url.get(_norm(w)) or {}).get("logprob_mode") for w in e.get("router_of") or []}
        return modes.pop() if len(modes) == 1 and None not in modes else None
    return e.get("logprob_mode") if e.get("logprob_mode") in ("raw", "scaled") else None
