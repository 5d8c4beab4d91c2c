"""Resume inside a trajectory: each completed LLM call of an unfinished unit, recorded as it completes.

    RUN/inflight/<key>/c0001.parquet   the call's generated tokens (the sidecar's format, agent/rundir/sidecar.py)
    RUN/inflight/<key>/c0001.json      its reply (text, reasoning, usage, ...) and the digest of its request;
                                       written last: its presence means the call is recorded

A rerun after a kill runs the unit again from its first call with :class:`JournaledBackend` in front of the
backend: while the method asks for exactly the requests it asked before (same messages, same sampling, in the
same order; the tool calls in between are answered by the run's tool cache), each is answered from the journal
without a server call; from the first request the journal does not hold on, calls go to the server and are
recorded. Sampling seeds are per trial (agent/run/config.py), so on a deterministic server the finished line
equals an uninterrupted run's. The unit's directory is removed once its line is written.

What is not journaled (ours): the adaptive image unloading's scoring calls (``score``), which are made again on
resume; a request that differs from the recorded one (other code, another model) ends the replay there and the
rest of the journal is discarded.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np

from ..backends.base import LogprobSemantics, ModelOutput, Usage
from ..backends.tokens import TokenArrays
from ..redact import redact_obj
from ..rundir import token_key
from ..rundir.common import atomic_write, write_json
from ..rundir.sidecar import decode, encode
from ..trajectory import token_arrays

__all__ = ["Journal", "JournaledBackend", "request_digest", "prune", "INFLIGHT"]

INFLIGHT = "inflight"


def request_digest(messages: list[dict], sampling) -> str:
    """What identifies a request: its messages and sampling, as JSON (images by the path or data they name), with
    every credential in use redacted. The journal stores replies redacted (a key a server echoed is never written),
    so a replayed reply carries ``[REDACTED]`` where the original carried the key: compared on the redacted form,
    the request that follows it is still the one recorded, and the replay goes on."""
    blob = json.dumps(redact_obj([messages, sampling.to_dict() if sampling is not None else None]), sort_keys=True,
                      default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


class Journal:
    """The recorded calls of one unit (``RUN/inflight/<key>/``)."""

    def __init__(self, run_dir, sample_id: str, trial: int):
        self.dir = Path(run_dir) / INFLIGHT / token_key(sample_id, trial)
        self.entries = self._read()

    def _read(self) -> list[dict]:
        out = []
        while True:  # calls in order; a missing or unreadable one ends what can be replayed
            meta = self.dir / f"c{len(out) + 1:04d}.json"
            try:
                e = json.loads(meta.read_text())
                if not isinstance(e, dict) or "digest" not in e:
                    break
            except (OSError, ValueError):
                break
            out.append(e)
        return out

    def replay(self, i: int) -> ModelOutput:
        """The ``i``-th recorded call (0-based) as the backend returned it."""
        e = self.entries[i]
        t = decode(self.dir / f"c{i + 1:04d}.parquet")
        k = int(e["top_k"])
        top_ids, top_lps = t["top_ids"][:, :k], t["top_logprobs"][:, :k]
        tokens = TokenArrays(t["id"], [("" if x is None else str(x)) for x in t["text"]], t["logprob"], top_ids,
                             top_lps, t["think"], (~np.isnan(top_lps)).sum(axis=1))
        ent = t["exact_entropy"]
        sem = e["semantics"]
        return ModelOutput(text=e["text"] or "", content_null=e["text"] is None, reasoning=e["reasoning"], tokens=tokens, finish_reason=e["finish_reason"],
                           usage=Usage(**e["usage"]), semantics=LogprobSemantics(sem["kind"], sem.get("temperature")),
                           backend=e["backend"], model=e["model"], latency_s=float(e["latency_s"]),
                           exact_entropy=ent.tolist() if np.isfinite(ent).any() else None, top_k_requested=k,
                           prompt_pieces=_pieces_in(e.get("prompt_pieces")))

    def record(self, i: int, digest: str, out: ModelOutput) -> None:
        """Record call ``i`` (0-based): tokens first, then the reply (its presence marks the call complete)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        k = int(out.top_k_requested)
        arrays = token_arrays(out, k)
        atomic_write(self.dir / f"c{i + 1:04d}.parquet", encode({0: arrays}, k))
        u = out.usage
        e = {"digest": digest, "text": None if out.content_null else out.text, "reasoning": out.reasoning, "finish_reason": out.finish_reason,
             "usage": {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
                       "cached_tokens": u.cached_tokens, "reasoning_tokens": u.reasoning_tokens, "cost": u.cost,
                       "provider": u.provider},
             "semantics": {"kind": out.semantics.kind, "temperature": out.semantics.temperature},
             "backend": out.backend, "model": out.model, "latency_s": out.latency_s, "top_k": k,
             "prompt_pieces": _pieces_out(out.prompt_pieces)}
        write_json(self.dir / f"c{i + 1:04d}.json", e)
        del self.entries[i:]
        self.entries.append(e)

    def discard_from(self, i: int) -> None:
        """Forget calls ``i``, ``i + 1``, … (the method asked for something else there)."""
        for j in range(i, max(len(self.entries), i + 1)):
            for ext in ("json", "parquet"):
                (self.dir / f"c{j + 1:04d}.{ext}").unlink(missing_ok=True)
        del self.entries[i:]

    def clear(self) -> None:
        """Remove the journal (its unit's line is written): renamed away first, so a kill mid-removal never
        leaves a partial journal that looks like a unit in flight."""
        gone = self.dir.with_name(f".done-{self.dir.name}-{os.getpid()}")
        try:
            os.rename(self.dir, gone)
        except OSError:  # never recorded a call
            return
        shutil.rmtree(gone, ignore_errors=True)
        try:
            os.rmdir(self.dir.parent)  # the last unit in flight: no empty RUN/inflight left behind
        except OSError:
            pass


def prune(run_dir, to_run: set[tuple[str, int]]) -> int:
    """Remove the journals of units that will not run (their lines are written) and any half-removed one; returns
    how many units in ``to_run`` have recorded calls to replay."""
    root = Path(run_dir) / INFLIGHT
    if not root.is_dir():
        return 0
    keep = {token_key(s, t) for s, t in to_run}
    live = 0
    for d in root.iterdir():
        if d.name in keep:
            live += 1
        else:
            shutil.rmtree(d, ignore_errors=True)
    try:
        os.rmdir(root)
    except OSError:
        pass
    return live


def _pieces_out(pieces):
    if pieces is None:
        return None
    fingerprint, items = pieces
    return [fingerprint, [[d.hex(), np.asarray(ids).astype(int).tolist()] for d, ids in items]]


def _pieces_in(raw):
    if raw is None:
        return None
    return raw[0], [(bytes.fromhex(d), np.asarray(ids, dtype=np.int32)) for d, ids in raw[1]]


class JournaledBackend:
    """A unit's backend: recorded calls answered from its :class:`Journal`, new ones made and recorded."""

    def __init__(self, inner, journal: Journal):
        self.inner, self.journal = inner, journal
        self.calls = 0      # generate calls asked for so far
        self.replayed = 0   # of them answered from the journal
        self.unrecorded = False  # a record failed: the rest of this unit is not journaled

    async def generate(self, messages: list[dict], sampling=None) -> ModelOutput:
        i, digest = self.calls, request_digest(messages, sampling)
        if i < len(self.journal.entries) and self.journal.entries[i]["digest"] == digest:
            self.calls += 1
            self.replayed += 1
            return self.journal.replay(i)
        # a call that raises (a request the server refuses, which --protocol release goes on from) takes no place
        # in the journal, and leaves the recorded calls after it to replay
        out = await self.inner.generate(messages, sampling)
        self.calls += 1
        if i < len(self.journal.entries):
            self.journal.discard_from(i)
        if not self.unrecorded:
            try:
                self.journal.record(i, digest, out)
            except OSError:  # a full disk, say: the unit runs on unjournaled (a kill would redo these calls); the
                self.unrecorded = True  # line's own write reports the disk, as without a journal
                self.journal.discard_from(i)
        return out

    def __getattr__(self, name):  # score, served_weights, … as the backend has them
        return getattr(self.inner, name)
