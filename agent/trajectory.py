"""The trajectory record: an append-only list of events per (sample, trial), each event created whole.

    traj = Trajectory(sample, trial=0, method="react", variant="")
    call = traj.llm_call(messages, out, state="react")        # every LLM call, exactly as sent (still open)
    traj.settle(call, action={"kind": "tool_call", ...})      # its parsed action (or error=...) closes it
    traj.tool_call(call, result)                              # every tool call
    traj.branch_begin(...); traj.branch_end(...)              # MM-ContextFold branches are spans
    traj.final_answer(call, "Paris"); line = traj.to_line("ok", "Paris")

An LLM call's event is appended once its action is known: when it is settled, or as it is when the next event
is added or the trajectory is read (a call that ends the episode without a parsed action). Every adder returns a
read-only view, so no event changes after it was appended. The event kinds and their fields are the models in
:mod:`agent.record.events`; ``python -m agent.rundir schema`` publishes them as JSON Schema.
"""
from __future__ import annotations

import copy
import hashlib
import json
import time
from collections import Counter
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np

from .backends.base import ModelOutput, SamplingParams, top_id_matrix, top_matrix
from .backends.messages import query_image_flags, record_messages
from .jsonio import dumps
from .record import LlmCall, Sampling

__all__ = ["EventView", "Trajectory", "SCHEMA_VERSION", "token_arrays"]

EventView = Mapping[str, Any]  # a recorded event, read-only

SCHEMA_VERSION = 2  # 2: reasoning kept in the history, retrieved images in observations, n_query_images


def token_arrays(out: ModelOutput, k: int) -> dict[str, np.ndarray]:
    """Columnar per-token arrays of one generation (top-k NaN / -1 padded)."""
    n = len(out.tokens)
    ent = (np.asarray(out.exact_entropy, dtype=np.float32) if out.exact_entropy is not None and len(out.exact_entropy) == n
           else np.full(n, np.nan, dtype=np.float32))
    t = out.tokens
    return {"id": t.ids.astype(np.int32), "text": np.array(t.texts, dtype=object),
            "logprob": t.logprobs.astype(np.float32), "think": t.think.copy(),
            "top_ids": top_id_matrix(t, k), "top_logprobs": top_matrix(t, k, np.float32), "exact_entropy": ent}


class Trajectory:
    def __init__(self, sample, trial: int, method: str, variant: str = ""):
        self.sample = sample
        self.trial = int(trial)
        self.method = method
        self.variant = variant
        self._events: list[dict] = []
        self._open: dict | None = None       # the last LLM call, until its action is known
        self.messages: list[dict] = []
        self._msg_ids: dict[str, int] = {}
        self.tokens: dict[int, dict[str, np.ndarray]] = {}   # call index -> arrays
        self.n_calls = 0
        self.started = time.time()
        self.backend = ""
        self.model = ""
        self.top_k = 0
        self.query_hashes: list[str] = []
        self.image_files: dict[str, str] = {}   # sha256 -> path of every retrieved image shown (stored with the run)
        self.extra: dict[str, Any] = {}          # line-level fields a method adds (e.g. image_unload)
        # every distinct message piece of the prompts sent, by digest, and the fingerprint of the tokenizer that made
        # them (from a backend that sends token ids: stored in the token sidecar, agent/backends/pieces.py)
        self.prompt_pieces: dict[bytes, np.ndarray] = {}
        self.tokenizer: str | None = None

    # ------------------------------------------------------------------ events
    @property
    def events(self) -> list[dict]:
        """The events so far (an open LLM call is appended as it is)."""
        self._close()
        return self._events

    def _close(self, **action) -> None:
        if self._open is not None:
            ev, self._open = self._open, None
            self._events.append({"type": "llm_call", "id": len(self._events), **ev, **action})

    def _add(self, type_: str, parent: str | None, **fields) -> EventView:
        self._close()
        ev = {"type": type_, "id": len(self._events), "parent": parent, "t": round(time.time(), 3), **fields}
        self._events.append(ev)
        return MappingProxyType(ev)

    def settle(self, call: EventView, *, action: dict | None = None, error: str | None = None) -> None:
        """Append the open LLM call ``call`` with what came of it: the ``action`` parsed from its reply and/or the
        ``error`` that made it unusable. A call is settled at most once, before anything else is recorded."""
        if self._open is None or self._open["index"] != call["index"]:
            raise RuntimeError(f"LLM call {call['index']} is already recorded: settle a call before the next event")
        self._close(**({"action": action} if action is not None else {}),
                    **({"action_error": error} if error is not None else {}))

    def _message_ids(self, messages: list[dict]) -> list[int]:
        out = []
        for m in record_messages(messages):
            key = dumps(m, sort_keys=True)
            i = self._msg_ids.get(key)
            if i is None:
                i = self._msg_ids[key] = len(self.messages)
                self.messages.append(m)
            out.append(i)
        return out

    def llm_call(self, messages: list[dict], out: ModelOutput, *, state: str, branch: str | None = None,
                 correction: bool = False, forced: bool = False, parent: str | None = None,
                 sampling: dict | None = None) -> EventView:
        self._close()
        self.n_calls += 1
        idx = self.n_calls
        mids = self._message_ids(messages)
        hashes, n_query = [], 0
        for i in mids:
            c = self.messages[i].get("content")
            if isinstance(c, list):
                for p, q in zip(c, query_image_flags(c)):
                    if isinstance(p, dict) and p.get("type") == "image":
                        hashes.append(p.get("sha256") or p.get("url"))
                        n_query += q  # by position (after its <image_k>), never by content: paper B.5
        self.top_k = max(self.top_k, out.top_k_requested, max(out.top_counts(), default=0))
        self.tokens[idx] = token_arrays(out, out.top_k_requested)
        if out.prompt_pieces is not None:
            self._keep_pieces(*out.prompt_pieces)
        self.backend, self.model = out.backend, out.model
        u = out.usage
        self._open = dict(
            parent=parent if parent is not None else branch, t=round(time.time(), 3), index=idx, state=state,
            branch=branch,
            correction=correction, forced=forced, message_ids=mids, image_hashes=hashes, n_images=len(hashes),
            n_query_images=n_query,
            text=None if out.content_null else out.text, reasoning=out.reasoning, finish_reason=out.finish_reason,
            usage={"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
                   "cached_tokens": u.cached_tokens, "reasoning_tokens": u.reasoning_tokens,
                   **({"cost": u.cost, "provider": u.provider} if u.cost is not None else {})},
            latency_s=round(out.latency_s, 4), n_tokens=len(out.tokens), think_tokens=int(out.think_mask().sum()),
            semantics=out.semantics.label(), sampling=sampling or {},
            backend=out.backend, model=out.model, top_k=out.top_k_requested,
        )
        return MappingProxyType(self._open)

    def _keep_pieces(self, fingerprint: str, pieces: list) -> None:
        """Keep each new piece of a call's prompt (references to the backend's arrays: no copy). A trajectory's calls
        share one tokenizer; pieces from another one (a backend swapped mid-trajectory) are not kept."""
        if self.tokenizer is None:
            self.tokenizer = fingerprint
        if fingerprint == self.tokenizer:
            keep = self.prompt_pieces
            for d, ids in pieces:
                if d not in keep:
                    keep[d] = ids

    def tool_call(self, call_ev: EventView, res, shown_images: int | None = None) -> EventView:
        """``shown_images``: how many of the result images went into the observation (None: all)."""
        shown = list(res.images[:shown_images] if shown_images is not None else res.images)
        for sha, path in shown:
            self.image_files.setdefault(sha, str(path))
        return self._add("tool_call", call_ev.get("parent"), call_index=call_ev["index"], name=res.name, args=res.args,
                         observation=res.observation, ok=res.ok, cache_hit=res.cache_hit, paid_calls=res.paid_calls,
                         image_sha256=res.image_sha256, result_images=[sha for sha, _ in shown])

    def branch_begin(self, branch: str, *, description: str, prompt: str, assigned_images: list[str],
                     assigned_hashes: list[str], main_call_index: int) -> EventView:
        return self._add("branch_begin", branch, branch=branch, description=description, prompt=prompt,
                         assigned_images=assigned_images, assigned_hashes=assigned_hashes, main_call_index=main_call_index)

    def branch_end(self, branch: str, *, message: str, reason: str, steps: int) -> EventView:
        return self._add("branch_end", branch, branch=branch, message=message, reason=reason, steps=steps)

    def init_end(self, descriptions: dict[str, str], parsed: dict[str, bool]) -> EventView:
        return self._add("init_end", "init", descriptions=descriptions, parsed=parsed)

    def unload_probe(self, call_ev: EventView, **fields) -> EventView:
        return self._add("unload_probe", call_ev.get("parent"), call_index=call_ev["index"], **fields)

    def final_answer(self, call_ev: EventView | None, answer: str, *, forced: bool = False) -> EventView:
        return self._add("final_answer", None, answer=answer, call_index=call_ev["index"] if call_ev else None, forced=forced)

    def error(self, kind: str, message: str) -> EventView:
        return self._add("error", None, kind=kind, message=message)

    def seed_prefix(self, line: dict, tokens: dict[str, np.ndarray], upto: int) -> None:
        """Start from a recorded trajectory's calls 1..upto (events, messages, token arrays), as recorded."""

        keep = [e for e in line["events"] if (e["type"] == "llm_call" and e["index"] <= upto)
                or (e["type"] == "tool_call" and e["call_index"] <= upto)]
        self._open = None
        self._events = [dict(copy.deepcopy(e), id=i) for i, e in enumerate(keep)]
        self.messages = copy.deepcopy(line["messages"])
        self._msg_ids = {dumps(m, sort_keys=True): i for i, m in enumerate(self.messages)}
        self.n_calls = upto
        self.query_hashes = list((line.get("query_images") or {}).values())
        if tokens:
            self.top_k = max(self.top_k, tokens["top_logprobs"].shape[1])
            for c in range(1, upto + 1):
                sel = tokens["call"] == c
                self.tokens[c] = {k: tokens[k][sel] for k in ("id", "text", "logprob", "think", "top_ids",
                                                                "top_logprobs", "exact_entropy", "unload_kl",
                                                                "unload_dH") if k in tokens}
        self.backend, self.model = line.get("backend", ""), line.get("model", "")

    # ------------------------------------------------------------------ views
    def llm_events(self) -> list[dict]:
        return [e for e in self.events if e["type"] == "llm_call"]

    def calls_summary(self) -> list[dict]:
        tools_by_call: dict[int, list[str]] = {}
        for e in self.events:
            if e["type"] == "tool_call":
                tools_by_call.setdefault(e["call_index"], []).append(e["name"])
        out = []
        for e in self.llm_events():
            act = e.get("action") or {}
            out.append({
                "index": e["index"], "state": e["state"], "branch": e["branch"], "correction": e["correction"],
                "forced": e["forced"], "n_images": e["n_images"], "n_query_images": e.get("n_query_images", 0),
                "image_hashes": e["image_hashes"],
                "prompt_tokens": e["usage"]["prompt_tokens"], "completion_tokens": e["usage"]["completion_tokens"],
                "cached_tokens": e["usage"]["cached_tokens"], "think_tokens": e["think_tokens"],
                **({"cost": e["usage"]["cost"]} if e["usage"].get("cost") is not None else {}),
                "n_tokens": e["n_tokens"], "latency_s": e["latency_s"], "finish_reason": e["finish_reason"],
                "action": act.get("kind") or ("malformed" if e.get("action_error") else None),
                "tool": (tools_by_call.get(e["index"]) or [act.get("name")])[0] if act.get("kind") == "tool_call" else None,
            })
        return out

    def to_line(self, status: str, answer: str, *, error: str | None = None, extra: dict | None = None) -> dict[str, Any]:
        s = self.sample
        tools = Counter(e["name"] for e in self.events if e["type"] == "tool_call")
        usage: dict = {}  # per tool: calls, answered from the cache, paid API calls (the run's cost ledger)
        for e in self.events:
            if e["type"] == "tool_call":
                u = usage.setdefault(e["name"], {"calls": 0, "cached": 0, "paid": 0})
                u["calls"] += 1
                u["cached"] += bool(e.get("cache_hit"))
                u["paid"] += int(e.get("paid_calls") or 0)
        n_tokens = sum(len(a["id"]) for a in self.tokens.values())
        return {
            "schema_version": SCHEMA_VERSION,
            "sample_id": s.id, "trial": self.trial, "method": self.method, "variant": self.variant,
            "benchmark": s.benchmark, "category": s.category, "paper_category": s.paper_category,
            "question": s.question, "gold": s.answer, "answer": answer or "", "status": status, "error": error,
            "query_images": {f"<image_{i}>": h for i, h in enumerate(self.query_hashes)},
            "n_calls": self.n_calls, "n_tool_calls": sum(tools.values()), "tool_calls": dict(tools),
            "tool_usage": usage,
            "generated_tokens": n_tokens, "think_tokens": int(sum(a["think"].sum() for a in self.tokens.values())),
            "backend": self.backend, "model": self.model,
            "started": round(self.started, 3), "finished": round(time.time(), 3),
            # what the model said, as one digest (in the line's summary: trial independence is checked from it)
            "responses_sha": responses_fingerprint({"events": self.events, "answer": answer, "status": status}),
            "duration_s": round(time.time() - self.started, 3),
            "calls": self.calls_summary(), "events": self.events, "messages": self.messages,
            **self.extra, **(extra or {}),
        }


def responses_fingerprint(line: dict) -> str:
    """A digest of what the model said in a trajectory (every call's visible text and reasoning)."""

    calls = [e for e in line.get("events") or () if e.get("type") == "llm_call"]
    said = [[e.get("text"), e.get("reasoning")] for e in calls] or [line.get("answer"), line.get("status")]
    return hashlib.sha256(json.dumps(said, ensure_ascii=False).encode("utf-8", "surrogatepass")).hexdigest()


def recorded_sampling(event: LlmCall) -> SamplingParams:
    """The sampling parameters a recorded ``llm_call`` event was sent with (the probes replay calls with them)."""
    s = event.sampling.as_recorded() if isinstance(event.sampling, Sampling) else dict(event.sampling)
    keep = {k: s[k] for k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens",
                               "top_logprobs", "seed", "stop", "enable_thinking", "chat_template_kwargs") if k in s}
    return SamplingParams(**keep)
