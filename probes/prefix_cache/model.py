"""The work of ``python -m probes.prefix_cache`` once its arguments parse: probes/prefix_cache/cli.py holds the flags, the
package's docstring says what it does and writes."""
from __future__ import annotations

import logging
from collections import deque
from pathlib import Path

import numpy as np

from agent.backends.local import load_chat_renderer
from agent.backends.messages import split_text_and_images, strip_query_images
from agent.backends.tiny_model import ensure_tiny_model
from agent.backends.vision import UnknownProcessor, VisionGrid
from agent.cli import done
from agent.errors import ToolkitError
from agent.record import EntropyStep, LlmCall
from agent.rundir import RunError, load_run, write_json
from agent.rundir.probe_outputs import probe_dir, read_rows
from analysis.estimators.selection import select_trajectories
from serving.plan import ADMITTED_SLOTS_PER_REQUEST, SLOTS_PER_REQUEST

log = logging.getLogger(__name__)

__all__ = ["report", "RadixLRU", "prefix_keys", "simulate", "probe_streams", "probe_requests", "gpu_cost", "calibration", "prefix_cache_command"]

# The cost model behind --gpu-cost (docs/performance.md) is the launcher's FLOPs model (serving/plan.py).
REMOVAL_STEPS = 5  # Figure 2(c)'s k = 1..5 (paper §3.2.3)


_P = np.uint64(0x100000001B3)          # the polynomial's base (FNV's prime: odd, well mixed)
_LEN = np.uint64(0x9E3779B97F4A7C15)   # mixes the prefix length into its key


def prefix_keys(tokens: np.ndarray, page: int = 1) -> np.ndarray:
    """One 64-bit key per prefix (of length page, 2·page, ...): a polynomial hash of the tokens, computed as a
    wrapping cumulative sum, with the length mixed in. Equal prefixes have equal keys; unequal ones collide
    with probability ~2^-64 per pair (not adversarial input)."""
    t = np.asarray(tokens, dtype=np.int64).astype(np.uint64)
    n = len(t)
    with np.errstate(over="ignore"):
        w = np.cumprod(np.full(n, _P, dtype=np.uint64))
        s = np.cumsum(t * w, dtype=np.uint64)
        lens = np.arange(1, n + 1, dtype=np.uint64)
        keys = s ^ (lens * _LEN)
    return keys[page - 1::page]


class RadixLRU:
    """A token-level prefix tree with least-recently-used leaf eviction at ``capacity`` tokens (SGLang's
    RadixCache policy), held as the set of cached prefixes: a prefix is cached only with all its own prefixes,
    so the longest match is a binary search. Each node is owned by the last request that touched it; eviction
    takes the oldest request's nodes deepest first, which are always leaves (a deeper node touched later would
    have touched them too).

    A hybrid model's states (``state_interval``) sit in their own pool of ``state_slots`` slots, of which each of
    the ``running`` requests holds :data:`SLOTS_PER_REQUEST` (at most ``state_slots`` /
    :data:`ADMITTED_SLOTS_PER_REQUEST` of them run: SGLang's cap); what is left holds the tree's states, least
    recently used evicted first (:meth:`_evict_states`)."""

    def __init__(self, capacity: int | None, state_interval: int | None = None, state_slots: int | None = None,
                 running: int = 1):
        self.capacity = capacity
        self.interval = state_interval  # the state grid; None: token-level reuse (a pure-attention model)
        self.states: dict = {}          # key -> (its path's keys, its index): where a state is stored, LRU first
        self.kids: dict = {}            # key -> how many cached keys extend it by one token
        self.bounds: set = set()        # keys where a tree node ends: an insert's end, a fork, a match's split
        if state_slots is not None:  # SGLang runs at most slots / 5 requests at once; the rest wait, holding none
            running = max(1, min(running, state_slots // ADMITTED_SLOTS_PER_REQUEST))
        self.state_room = None if state_slots is None else state_slots - SLOTS_PER_REQUEST * running
        self.owner: dict = {}
        self.groups: deque = deque()
        self.size = 0
        self.clock = 0

    def access(self, keys: np.ndarray, cap: int | None = None) -> int:
        """The number of leading tokens (keys) already cached and reusable; then the whole prompt is cached. A match
        stops one token short of the prompt, so that the last token is computed, and at ``cap``, a scoring
        request's ``logprob_start_len`` (SGLang's ``_compute_max_prefix_len``, srt/managers/schedule_batch.py)."""
        ks = keys.tolist()
        owner = self.owner
        lo, hi = 0, max(len(ks) - 1, 0) if cap is None else max(min(len(ks) - 1, cap), 0)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if ks[mid - 1] in owner:
                lo = mid
            else:
                hi = mid - 1
        track = len(ks)
        if self.interval and lo:
            self.bounds.add(ks[lo - 1])  # the match splits the node it ends in (unified_tree_core.py _split_node)
        if self.interval:  # a hybrid model: reuse ends where a recurrent state is stored (see hybrid_match)
            lo, track = self.hybrid_match(ks, lo)
            if lo:  # the match refreshes the state it reuses (mamba.py refresh_lru, MATCH_END) and locks it
                self.states[ks[lo - 1]] = self.states.pop(ks[lo - 1])
            self._evict_states(ks[lo - 1] if lo else None)
        ks = ks[:track]  # a hybrid model's request donates its KV up to its tracked state, nothing past it
        self.clock += 1
        aid = self.clock
        kids, prev = self.kids, None
        for k in ks:
            if k not in owner:
                self.size += 1
                if prev is not None:
                    kids[prev] = kids.get(prev, 0) + 1
                    if kids[prev] > 1:
                        self.bounds.add(prev)
            owner[k] = aid
            prev = k
        if self.interval and track:  # the tracked state enters the tree (or is refreshed there) most recent
            self.bounds.add(ks[track - 1])
            self.states.pop(ks[track - 1], None)
            self.states[ks[track - 1]] = (ks, track - 1)
        self.groups.append([aid, ks, len(ks)])
        self._evict()
        return lo

    def _evict_states(self, locked) -> None:
        """Free the state pool's slots a new request takes (its working state and track buffers): SGLang evicts the
        least recently used states (``evict_for_alloc(mamba_num=...)`` at ``HybridReqToTokenPool.alloc``; the walk is
        ``MambaComponent._evict_device_next_node``, srt/mem_cache/unified_cache/components/mamba.py). An inner node
        loses its state only, its KV stays; a leaf node goes whole, its KV back to where the node begins
        (``_cascade_evict``). Checked against SGLang's own classes at a small pool
        (tests/conformance/test_sglang_cache.py)."""
        if self.state_room is None:
            return
        states, kids, owner = self.states, self.kids, self.owner
        for s in list(states):
            if len(states) <= max(self.state_room, 0):
                return
            if s == locked:
                continue
            path, j = states.pop(s)
            if kids.get(s, 0) or s not in owner:
                continue  # an inner node: its KV stays
            while j >= 0:  # a leaf: its node's KV, back to where the node begins
                k = path[j]
                if k not in owner or (k != s and (k in self.bounds or kids.get(k, 0))):
                    break
                del owner[k]
                kids.pop(k, None)
                self.bounds.discard(k)
                self.size -= 1
                if j:
                    kids[path[j - 1]] -= 1
                j -= 1

    def hybrid_match(self, ks: list, lo: int) -> tuple[int, int]:
        """SGLang 0.5.23's Mamba radix cache under ``extra_buffer``: the match ends at the deepest node holding a
        linear-attention state within the KV hit ``lo`` (the Mamba component's match validator,
        srt/mem_cache/unified_cache/components/mamba.py ``create_match_validator``). The request's prefill then stores
        one state (``_mamba_radix_cache_v2_req_prepare_for_extend``, srt/managers/schedule_batch.py): at the
        checkpoint grid's last multiple of its extend, counted from its reused prefix (an extend shorter than the
        grid stores none), unless the KV hit reaches a grid point past that prefix, the branch point
        (``finalize_match_result_in_tree_core``: ``mamba_branching_seqlen``), which then takes the state instead.
        A finished request donates its KV only up to that state (``_select_finished_checkpoint``, same file as the
        validator: the key is cut to ``mamba_last_track_seqlen``; none when no state was tracked). Returns (the
        reused prefix, the donated length). Checked against SGLang's own UnifiedRadixCache and Mamba component on
        CPU (tests/conformance/test_sglang_cache.py)."""
        g = self.interval
        p = lo
        while p > 0 and not (ks[p - 1] in self.states and ks[p - 1] in self.owner):
            p -= 1
        extend = len(ks) - p
        track = 0
        if extend >= g:
            track = p + extend // g * g
            branch = lo // g * g
            if p < branch < track and (branch - p) % g == 0:
                track = branch
        return p, track

    def _evict(self) -> None:
        if self.capacity is None:
            return
        while self.size > self.capacity and len(self.groups) > 1:  # the newest request is being served
            g = self.groups[0]
            aid, ks = g[0], g[1]
            while g[2] > 0 and self.size > self.capacity:
                g[2] -= 1
                k = ks[g[2]]
                if self.owner.get(k) == aid:
                    del self.owner[k]
                    self.size -= 1
                    self.states.pop(k, None)  # a leaf's state goes with its KV
                    self.kids.pop(k, None)
                    self.bounds.discard(k)
                    if g[2] and ks[g[2] - 1] in self.kids:
                        self.kids[ks[g[2] - 1]] -= 1
            if g[2] == 0:
                self.groups.popleft()


def _order(streams: list[list[np.ndarray]], how: str, concurrency: int) -> list[tuple[int, int]]:
    """(trajectory, request) in the order they reach the servers."""
    if how == "step-major":
        depth = max((len(s) for s in streams), default=0)
        return [(t, r) for r in range(depth) for t in range(len(streams)) if r < len(streams[t])]
    out, waiting, slots = [], deque(range(len(streams))), []
    while waiting or slots:
        while waiting and len(slots) < concurrency:
            slots.append([waiting.popleft(), 0])
        for s in list(slots):  # each trajectory in flight sends its next request in turn
            out.append((s[0], s[1]))
            s[1] += 1
            if s[1] >= len(streams[s[0]]):
                slots.remove(s)
    return out


def simulate(streams: list[list[np.ndarray]], *, capacity: int | None, servers: int = 1, concurrency: int = 128,
             how: str = "per-trajectory", pinned: bool = True, page: int = 1, keys=None,
             state_interval: int | None = None, per_request: bool = False, caps=None,
             state_slots: int | None = None) -> dict:
    """Replay the requests (``streams``: per trajectory, its requests' prompt tokens in the order it sends them)
    through one :class:`RadixLRU` per server; returns prompt tokens, cached tokens and the cached share.
    ``state_interval``: Qwen3.5's hybrid cache (its state grid, :data:`STATE_GRID`), else token-level.
    ``keys``: the streams' :func:`prefix_keys` at this ``page``, when the caller replays them several times.
    ``per_request``: also ``hits``, the cached tokens of each ``(trajectory, request)``. ``caps``: per trajectory,
    each request's match cap (a scoring request's ``logprob_start_len``; None: none), as :func:`probe_requests`.
    ``state_slots``: each server's linear-attention state pool (None: unbounded), of which each of its requests in
    flight (``concurrency`` over ``servers``, at most its share of the trajectories) holds its own."""
    interval = None if state_interval is None else max(1, state_interval // page)
    running = max(1, min(-(-concurrency // servers), -(-len(streams) // servers)))
    caches = [RadixLRU(None if capacity is None else capacity // page, interval, state_slots, running)
              for _ in range(servers)]
    keys = keys if keys is not None else [[prefix_keys(r, page) for r in s] for s in streams]
    assigned, given = {}, [0] * servers
    rng = np.random.default_rng(0)  # unpinned: a server per request as a balancer without affinity picks one
    total = hit = 0
    hits = {}
    for t, r in _order(streams, how, concurrency):
        if pinned:
            if t not in assigned:
                assigned[t] = min(range(servers), key=lambda j: given[j])
                given[assigned[t]] += 1
            srv = assigned[t]
        else:
            srv = int(rng.integers(servers))
        h = caches[srv].access(keys[t][r], None if caps is None or caps[t][r] is None else caps[t][r] // page) * page
        hit += h
        total += len(streams[t][r])
        if per_request:
            hits[(t, r)] = h
    out = {"prompt_tokens": total, "cached_tokens": hit, "cached_share": hit / total if total else float("nan")}
    return {**out, "hits": hits} if per_request else out


def _image_tokens(img, grid=None) -> int:
    """Qwen's vision tokens for an image of this stored size: the model's processor rule
    (agent/backends/vision.py) where its config is known, else Qwen3.5's defaults."""

    return (grid or VisionGrid()).tokens(max(int(img.width), 1), max(int(img.height), 1))


def probe_streams(run_dir, *, mode: str = "regenerate", model_dir=None, limit: int | None = None):
    """Per trajectory the token streams the entropy probe sends (its order: steps ascending; teacher-forced:
    with images, then without, per step), rendered with the model's chat template."""
    return probe_requests(run_dir, mode=mode, model_dir=model_dir, limit=limit)[0]


def _cap(ids: np.ndarray, continuation) -> int | None:
    """A teacher-forced scoring request's ``logprob_start_len``: its expanded prompt's length - 1 (the probes'
    ``SGLangBackend.score_payload``); None for a generation."""
    return len(ids) - len(continuation) - 1 if len(continuation) else None


def probe_requests(run_dir, *, mode: str = "regenerate", model_dir=None, limit: int | None = None, keep=None):
    """:func:`probe_streams`, per stream ``(sample_id, trial, steps)``, and per stream each request's match cap
    (:func:`_cap`); ``keep``: only these ``(sample_id, trial)`` trajectories."""

    run = load_run(run_dir)
    md = model_dir or run.header.backend.model_dir or ensure_tiny_model(quiet=True)
    tok = load_chat_renderer(str(md))
    pad = tok.convert_tokens_to_ids("<|image_pad|>")

    try:
        grid = VisionGrid.from_model_dir(md)
    except UnknownProcessor:
        grid = VisionGrid()
    lines, _ = select_trajectories(sorted(run.index, key=lambda ln: ln.key)[: limit or None],
                                   include_unparsed=True)

    def ids_of(messages, continuation=()):
        hf, images = split_text_and_images(messages)
        text = tok.apply_chat_template(hf, add_generation_prompt=True, tokenize=False)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        out, k = [], 0
        for i in ids:  # each image: a block of tokens named by its content, as SGLang's cache keys them
            if i == pad and k < len(images):
                img = images[k]
                v = -(int(img.sha256[:12], 16) + 1)
                out.extend([v] * _image_tokens(img, grid))
                k += 1
            else:
                out.append(i)
        return np.asarray(out + list(continuation), dtype=np.int64)

    streams, names, caps = [], [], []
    for summary in lines:
        if keep is not None and summary.key not in keep:
            continue
        line = run.full(summary)
        steps = [c.index for c in line.calls if c.n_query_images > 0]
        if not steps:
            continue
        events = {e.index: e for e in line.events if isinstance(e, LlmCall)}
        cont = {}
        if mode == "teacher-forced" and line.tokens_file:
            t = run.tokens(line, ["call", "id"])
            cont = {int(c): t["id"][t["call"] == c].tolist() for c in np.unique(t["call"])}
        reqs, req_caps = [], []
        for s in steps:
            msgs = run.sendable_messages(line, events[s])
            if mode == "regenerate":
                reqs.append(ids_of(strip_query_images(msgs)))
                req_caps.append(None)
            else:
                for m in (msgs, strip_query_images(msgs)):
                    reqs.append(ids_of(m, cont.get(s, ())))
                    req_caps.append(_cap(reqs[-1], cont.get(s, ())))
        streams.append(reqs)
        caps.append(req_caps)
        names.append((summary.sample_id, summary.trial, steps))
    return streams, names, caps


def report(streams, *, capacity: int, servers: int, concurrency: int, state_interval: int | None = None,
           caps=None, state_slots: int | None = None) -> list[dict]:
    """Each order at one server and at ``servers``, ``concurrency`` trajectories in flight per server: token-level
    (a pure-attention model's bound), then, with ``state_interval``, the probes' order under the hybrid cache."""
    keys = [[prefix_keys(r) for r in s] for s in streams]  # once, for every replay below
    ideal = simulate(streams, capacity=None, servers=1, concurrency=concurrency, keys=keys, caps=caps)
    rows = []

    def row(order, n, r):
        rows.append({"order": order, "servers": n, **r, "of_ideal": r["cached_tokens"] / ideal["cached_tokens"]
                     if ideal["cached_tokens"] else float("nan")})
    for how, pinned in (("step-major", False), ("per-trajectory", False), ("per-trajectory", True)):
        for n in sorted({1, servers}):
            if n == 1 and pinned:
                continue  # one server: pinning changes nothing
            row(how + (" (pinned)" if pinned else ""), n, simulate(
                streams, capacity=capacity, servers=n, concurrency=concurrency * n, how=how, pinned=pinned, keys=keys,
                caps=caps))
    rows.append({"order": "ideal (unbounded, one server)", "servers": 1, **ideal, "of_ideal": 1.0})
    if state_interval:
        label = f"hybrid cache, state grid {state_interval}"
        pool = "" if state_slots is None else f", {state_slots} state slots"
        row(f"per-trajectory (pinned), {label}{pool}", servers, simulate(
            streams, capacity=capacity, servers=servers, concurrency=concurrency * servers, keys=keys,
            state_interval=state_interval, caps=caps, state_slots=state_slots))
        row(f"ideal, {label}", 1, simulate(streams, capacity=None, servers=1, concurrency=concurrency, keys=keys,
                                           state_interval=state_interval, caps=caps))
    return rows


def gpu_cost(streams, *, capacity: int, servers: int, concurrency: int, state_interval: int, rates: dict,
             removal_steps: int = REMOVAL_STEPS, caps=None, state_slots: int | None = None) -> list[dict]:
    """Prefill GPU-seconds of the tokens a cache does not serve, per panel and backbone, in the probes' order
    (pinned, ``servers``): Figure 2(b) sends every stream; Figure 2(c)'s replays open with the same requests
    for k = 1..``removal_steps`` (the history at step k, query images removed) and then continue live, which
    no recorded run predicts, so only their opening requests are counted. ``rates``: tokens per GPU-second
    per backbone."""
    panels = {"2(b) entropy": (streams, caps), f"2(c) removal, k<={removal_steps}, opening requests":
              ([s[:removal_steps] for s in streams], None)}  # replays generate: no logprob_start_len
    rows = []
    for panel, (ss, cc) in panels.items():
        kw = dict(capacity=capacity, servers=servers, concurrency=concurrency * servers, caps=cc)
        token = simulate(ss, **kw)
        hybrid = simulate(ss, **kw, state_interval=state_interval, state_slots=state_slots)
        for size, rate in rates.items():
            rows.append({"panel": panel, "backbone": size, "prompt_tokens": token["prompt_tokens"],
                         "token_level_s": (token["prompt_tokens"] - token["cached_tokens"]) / rate,
                         "hybrid_s": (hybrid["prompt_tokens"] - hybrid["cached_tokens"]) / rate,
                         "no_cache_s": token["prompt_tokens"] / rate})
    return rows


def calibration(run_dir, observed, *, model_dir=None, capacity: int, servers: int, concurrency: int,
                state_interval: int, state_slots: int | None = None) -> dict:
    """The server's recorded ``cached_tokens`` beside the model's prediction, for the requests an entropy probe
    (regenerate mode, whose rows carry the server's counts) sent: totals, and per request the prompt tokens (the
    server's count against our rendering: the image expansion and template) and the cached tokens. Ours: the first
    GPU run calibrates the model in one command."""
    rows, bad = read_rows(Path(observed) / "steps.jsonl", EntropyStep)
    rows = [r for r in rows if r.prompt_tokens is not None and r.mode == "regenerate"]
    if not rows:
        raise RunError(f"{observed}: no regenerate-mode step with the server's prompt_tokens and cached_tokens "
                       "(python -m probes.entropy RUN --mode regenerate records them)")
    seen = {(r.sample_id, r.trial, r.step): r for r in rows}
    streams, names, _ = probe_requests(run_dir, mode="regenerate", model_dir=model_dir,
                                       keep={(r.sample_id, r.trial) for r in rows})
    pred = {name: simulate(streams, capacity=capacity, servers=servers, concurrency=concurrency * servers,
                           state_interval=si, per_request=True, state_slots=state_slots) for name, si in
            (("hybrid", state_interval or None), ("token_level", None))}
    per = []
    for t, (sid, trial, steps) in enumerate(names):
        for r, step in enumerate(steps):
            got = seen.get((sid, trial, step))
            if got is not None:
                per.append({"sample_id": sid, "trial": trial, "step": step,
                            "prompt_tokens": got.prompt_tokens, "predicted_prompt_tokens": len(streams[t][r]),
                            "cached_tokens": got.cached_tokens or 0,
                            "predicted_cached_hybrid": pred["hybrid"]["hits"][(t, r)],
                            "predicted_cached_token_level": pred["token_level"]["hits"][(t, r)]})
    if not per:
        raise RunError(f"{observed}: its steps are not the run's image-bearing calls ({run_dir})")

    def share(key_hit, key_total):  # each side over its own prompt tokens: the server's count, or our rendering's
        total = sum(p[key_total] for p in per)
        return sum(p[key_hit] for p in per) / total if total else float("nan")
    return {"requests": len(per), "left_out_lines": bad, "servers": servers, "concurrency": concurrency,
            "capacity_tokens": capacity, "state_grid": state_interval, "state_slots": state_slots,
            "observed_share": share("cached_tokens", "prompt_tokens"),
            "predicted_hybrid_share": share("predicted_cached_hybrid", "predicted_prompt_tokens"),
            "predicted_token_level_share": share("predicted_cached_token_level", "predicted_prompt_tokens"),
            "prompt_tokens_differ": sum(p["prompt_tokens"] != p["predicted_prompt_tokens"] for p in per),
            "mean_abs_cached_error_hybrid": float(np.mean([abs(p["cached_tokens"] - p["predicted_cached_hybrid"])
                                                           for p in per])),
            "per_request": per}


def prefix_cache_command(a) -> int:
    """``python -m probes.prefix_cache`` once its arguments parse (and are checked: ``a.prefill_rates`` is the
    backbones' prefill rates, probes/prefix_cache/cli.py)."""
    if a.observed is not None:
        return _calibrate(a)

    try:
        streams, _, caps = probe_requests(a.run_dir, mode=a.mode, model_dir=a.model_dir, limit=a.limit)
    except (ToolkitError, OSError, ValueError) as e:
        log.error(f"error: {e}")
        return 2
    if not streams:
        log.error(f"error: {a.run_dir}: no trajectory with an image-bearing step")
        return 2
    n_req = sum(len(s) for s in streams)
    print(f"{len(streams)} trajectories, {n_req} {a.mode} requests, "
          f"{sum(len(r) for s in streams for r in s):,} prompt tokens; cache {a.capacity_tokens:,} tokens per server")
    for r in report(streams, capacity=a.capacity_tokens, servers=a.servers, concurrency=a.concurrency,
                    state_interval=a.state_grid or None, caps=caps, state_slots=a.state_slots):
        print(f"  {r['order']:72s} servers {r['servers']}: {100 * r['cached_share']:5.1f} % of prompt tokens cached "
              f"({100 * r['of_ideal']:5.1f} % of ideal)")
    if a.gpu_cost:
        _print_cost(gpu_cost(streams, capacity=a.capacity_tokens, servers=a.servers, concurrency=a.concurrency,
                             state_interval=a.state_grid, rates=a.prefill_rates, caps=caps, state_slots=a.state_slots), a)
    done([], f"python -m probes.entropy {a.run_dir} --mode {a.mode}   (its probe.json: the server's own cached_tokens)")
    return 0


def _calibrate(a) -> int:
    try:
        d = Path(a.observed) if a.observed else probe_dir(a.run_dir, ("entropy-regenerate",), "probes.entropy")
        cal = calibration(a.run_dir, d, model_dir=a.model_dir, capacity=a.capacity_tokens, servers=a.servers,
                          concurrency=a.concurrency, state_interval=a.state_grid, state_slots=a.state_slots)
    except (ToolkitError, OSError, ValueError) as e:
        log.error(f"error: {e}")
        return 2
    write_json(d / "cache_calibration.json", cal, indent=2)
    print(f"{cal['requests']} regenerate requests of {d}: the server cached {100 * cal['observed_share']:.1f} % of "
          f"their prompt tokens; the model predicts {100 * cal['predicted_hybrid_share']:.1f} % (hybrid, grid "
          f"{a.state_grid}) and {100 * cal['predicted_token_level_share']:.1f} % (token-level bound), "
          f"{a.servers} servers x {a.concurrency} in flight")
    print(f"  per request: mean |cached - predicted| {cal['mean_abs_cached_error_hybrid']:.0f} tokens; prompt token "
          f"counts differ from our rendering in {cal['prompt_tokens_differ']} of {cal['requests']} requests")
    done([str(d / "cache_calibration.json")], "docs/performance.md, 'Prefix reuse on Qwen3.5's hybrid cache'")
    return 0


def _print_cost(rows, a) -> None:
    measured = {i.partition("=")[0] for i in a.prefill_rate or []}
    print(f"prefill GPU-seconds of uncached tokens (estimate; FLOPs model at {a.gpu_tflops:g} TFLOPS x MFU {a.mfu:g} "
          f"unless measured), probes' order, {a.servers} servers pinned:")
    print(f"  {'panel':42s} {'backbone':18s} {'no cache':>10s} {'token-level (bound)':>20s} "
          f"{f'hybrid, grid {a.state_grid}':>22s}")
    for r in rows:
        src = "measured" if r["backbone"] in measured else "FLOPs"
        print(f"  {r['panel']:42s} {r['backbone'] + ' (' + src + ')':18s} {r['no_cache_s']:10.1f} "
              f"{r['token_level_s']:20.1f} {r['hybrid_s']:22.1f}")


