"""One probed step of the entropy probe (paper §3.2.2, B.4): H(τ_t) and H(τ_t^IR) over the think tokens, ΔH with
its bounds, and (teacher-forced) KL(with ‖ without) per token; plus the forking-token and bound summaries.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agent.backends.base import BackendError, Continuation, model_vocab_size, top_id_matrix, top_matrix
from agent.backends.messages import image_shas, strip_query_images
from agent.lazy import lazy_module
from agent.record import LlmCall, ResultLine
from agent.rundir import Run, RunError
from agent.trajectory import recorded_sampling
from analysis.estimators.entropy import (
    AGGREGATIONS,
    aggregate_entropies,
    entropy_high,
    entropy_histogram,
    grouped_tail_entropy,
)
from analysis.estimators.influence import token_influence

from .store import ALTERNATIVES

pd = lazy_module("pandas")  # loads on first use: a command's --help needs none of it (agent/lazy.py)


def _think_mean(values: np.ndarray, think: np.ndarray) -> float:
    v = values[think]
    return float(np.add.reduce(v, dtype=np.float64)) / len(v) if len(v) else float("nan")




class KnownIds:
    """The alternatives' ids whose texts a trajectory's earlier steps already carry, as one sorted int32 array: four
    bytes an id for each trajectory in flight, where a trajectory meets thousands of ids of a real vocabulary (ours;
    docs/performance.md)."""

    def __init__(self):
        self.ids = np.zeros(0, dtype=np.int32)

    def new(self, u: np.ndarray) -> np.ndarray:
        """Of the sorted distinct ids ``u``, those not known yet; they are known from now on (each looked up and
        inserted in place by binary search: no sort of the known ids again at every step; docs/performance.md)."""
        at = np.searchsorted(self.ids, u)
        known = at < len(self.ids)
        known[known] = self.ids[at[known]] == u[known]
        fresh = u[~known]
        if len(fresh):
            self.ids = np.insert(self.ids, at[~known], fresh.astype(np.int32))
        return fresh


def _alternatives(with_tokens, without_tokens, pos, known: KnownIds | None = None) -> dict:
    """The top-:data:`ALTERNATIVES` ids and logprobs of each think token under both contexts, and the texts of
    those ids (``texts``: {id: text}, decoded once per id by the backend's tokenizer). ``known``: the ids whose
    texts the trajectory's earlier steps already carry (updated here); only new ones are decoded and kept, since a
    trajectory's file holds one text table for all its steps (ours: most alternatives recur from step to step)."""

    known = KnownIds() if known is None else known
    out = {}
    for side, toks in (("w", with_tokens), ("o", without_tokens)):
        out[f"{side}_ids"] = top_id_matrix(toks, ALTERNATIVES)[pos].astype(np.int64)
        out[f"{side}_lp"] = top_matrix(toks, ALTERNATIVES, np.float32)[pos]
    # both sides: one sort, then each id once (cheaper here than np.unique: docs/performance.md)
    u = np.sort(np.concatenate([out["w_ids"].ravel(), out["o_ids"].ravel()]))
    if len(u):
        u = u[np.concatenate(([True], u[1:] != u[:-1]))]
    need = known.new(u[u >= 0]).tolist()  # ascending, each id once
    dec = getattr(with_tokens, "_decode", None) or getattr(without_tokens, "_decode", None)
    many = getattr(getattr(dec, "__self__", None), "_decode_many", None)  # the backend's, all at once
    out["texts"] = dict(zip(need, many(need))) if many else {i: (dec(i) if dec else "") for i in need}
    return out


def _aggregations(h_with, think_with, top_with, h_without, think_without, top_without) -> dict:
    """Every aggregation of both sides' per-token entropies (analysis/estimators/entropy.py ``AGGREGATIONS``; issue 85), as
    ``{name: [with, without]}`` (None where undefined): what the robustness analysis compares ΔH under."""
    w = aggregate_entropies(h_with, think_with, top_with)
    o = aggregate_entropies(h_without, think_without, top_without)
    return {a: [None if not np.isfinite(w[a]) else w[a], None if not np.isfinite(o[a]) else o[a]]
            for a in AGGREGATIONS}


def call_slices(call: np.ndarray) -> dict:
    """{call index: slice of its rows} (a sidecar's rows are grouped by call, in order)."""
    if len(call) and np.all(call[1:] >= call[:-1]):
        start = np.r_[0, np.flatnonzero(call[1:] != call[:-1]) + 1]
        ends = np.r_[start[1:], len(call)]
        return {int(call[a]): slice(int(a), int(b)) for a, b in zip(start.tolist(), ends.tolist())}
    return {int(c): np.flatnonzero(call == c) for c in np.unique(call)}


async def _regenerate_side(row: dict, ev: LlmCall, tok: dict, sel, think, without, backend, H_all, Hhi_all, vocab) -> None:
    """Regenerate mode (the paper's): H(τ_t) from the recorded response, H(τ_t^IR) from a new one sampled without
    the query images with the recorded sampling parameters and logprob semantics."""
    H = H_all[sel] if H_all is not None else grouped_tail_entropy(tok["top_logprobs"][sel])
    row["H_with"] = _think_mean(H, think)
    if vocab:
        hi = Hhi_all[sel] if Hhi_all is not None else entropy_high(tok["top_logprobs"][sel], H, vocab)
        row["H_high_with"] = _think_mean(hi, think)
    ex = tok["exact_entropy"][sel][think]  # NaN where the backend had no full distribution (a server)
    row["H_exact_with"] = float(np.mean(ex, dtype=np.float64)) if len(ex) and np.isfinite(ex).all() else float("nan")
    sp = recorded_sampling(ev)
    out = await backend.generate(without, sp)
    if ev.semantics and out.semantics.label() != ev.semantics:
        raise BackendError(f"regenerated logprobs are {out.semantics.label()} but the record's are {ev.semantics}: "
                           "the two sides would describe different distributions (use the same --logprob-mode)")
    th2 = out.think_mask()
    row["n_think_without"] = int(th2.sum())
    # float32, as the recorded side is stored: both sides of ΔH go through the same arithmetic
    # (computed in float32 straight from the reply's arrays: no converted copy)
    top = top_matrix(out.tokens, 20, getattr(getattr(out.tokens, "top_logprobs", None), "dtype", np.float64), copy=False)
    h2 = grouped_tail_entropy(top, compute=np.float32)
    row["H_without"] = _think_mean(h2, th2)
    # forking-token statistics (the run-wide threshold is applied after the probe): each side's think tokens
    row["fork"] = {"w": entropy_histogram(H[think]), "o": entropy_histogram(np.asarray(h2)[th2])}
    row["agg"] = _aggregations(H, think, tok["top_logprobs"][sel], h2, th2, top)
    if vocab:
        row["H_high_without"] = _think_mean(entropy_high(top, h2, vocab), th2)
    if out.exact_entropy is not None:
        row["H_exact_without"] = _think_mean(np.asarray(out.exact_entropy, dtype=np.float64), th2)
    row["regenerated_text"] = out.text[:2000]
    # what the server did for it: prompt tokens, those served from its prefix cache, and the request's time
    # (summed per probe in probe.json: the GPU time a figure costs, and whether the request order paid off)
    row["prompt_tokens"], row["cached_tokens"] = int(out.usage.prompt_tokens), int(out.usage.cached_tokens)
    row["latency_s"] = round(float(out.latency_s), 4)


async def _teacher_forced_side(row: dict, line: ResultLine, ev: LlmCall, tok: dict, sel, think, with_imgs, without, backend,
                               vocab, known_texts) -> dict:
    """Teacher-forced mode: the recorded response scored under both contexts, with the KL influence per token;
    returns the step's per-token columns (probes/entropy/store.py)."""
    ids = np.asarray(tok["id"][sel]).astype(np.int64, copy=False).tolist()  # Python ints, by one C-level pass
    if not ids or min(ids) < 0:
        raise RunError(f"{line.sample_id} step {ev.index}: the record has no token ids "
                       "(teacher-forced scoring needs them; use --mode regenerate)")
    texts = tok.get("text")
    # ids are what is scored; the text rides along for backends that cannot map ids back (the scripted fake)
    cont = Continuation(ids=ids, text=None if texts is None or any(t is None for t in texts[sel])
                        else "".join(texts[sel]))
    a = await backend.score(with_imgs, cont, top_logprobs=20)
    b = await backend.score(without, cont, top_logprobs=20)
    for side, sc in (("with", a), ("without", b)):
        if len(sc.tokens) != len(ids):
            raise BackendError(f"scoring returned {len(sc.tokens)} positions for {len(ids)} tokens")
        if sc.exact_entropy is not None:
            row[f"H_exact_{side}"] = _think_mean(np.asarray(sc.exact_entropy, dtype=np.float64), think)
    # the same quantities the adaptive image unloading computes online (analysis.estimators.influence.token_influence)
    inf = token_influence(a.tokens, b.tokens, think, vocab=vocab)
    row["H_with"], row["H_without"] = inf["H_with"], inf["H_without"]
    if vocab:
        row["H_high_with"], row["H_high_without"] = inf["H_high_with"], inf["H_high_without"]
    row["kl_with_without"] = inf["kl_mean"]
    # forking tokens: the same tokens, binned by their entropy with the images (dH summed per bin too)
    pos = inf["pos"]
    row["fork"] = {"w": entropy_histogram(inf["per_token_H_with"][pos], inf["dH"]),
                   "o": entropy_histogram(inf["per_token_H_without"][pos])}
    row["n_think_without"] = row["n_think"]
    row["agg"] = _aggregations(inf["per_token_H_with"], think, top_matrix(a.tokens, 20, np.float32, copy=False),
                               inf["per_token_H_without"], think, top_matrix(b.tokens, 20, np.float32, copy=False))
    # per think token: the entropy change and the KL influence (the trajectory viewer colours tokens by them),
    # and the top-5 alternatives under both contexts (shown on hover)
    return {"pos": inf["pos"], "dH": inf["dH"].astype(np.float32), "kl": inf["kl"].astype(np.float32),
            **_alternatives(a.tokens, b.tokens, inf["pos"], known_texts)}


@dataclass
class StepContext:
    """What every probed step of one trajectory shares: the run, the trajectory's line and token arrays, the backend
    and mode, and what is derived once per trajectory (the calls' token slices; regenerate: the recorded tokens'
    entropies and their upper bounds). ``known_texts``: the alternatives' ids whose texts earlier steps kept;
    ``images``: (the probe's image users, this trajectory's images), or None."""

    run: Run
    line: ResultLine
    tok: dict
    backend: Any
    mode: str
    vocab: int | None = None
    known_texts: KnownIds = field(default_factory=KnownIds)
    images: tuple | None = None
    slices: dict = field(init=False)
    H_all: np.ndarray | None = field(init=False, default=None)
    Hhi_all: np.ndarray | None = field(init=False, default=None)

    def __post_init__(self):
        self.slices = call_slices(self.tok["call"])
        if self.mode == "regenerate":
            self.H_all = grouped_tail_entropy(self.tok["top_logprobs"])
            if self.vocab:
                self.Hhi_all = entropy_high(self.tok["top_logprobs"], self.H_all, self.vocab)


async def probe_step(ctx: StepContext, ev: LlmCall) -> tuple[dict, dict | None]:
    """One step's row (paper §3.2.2): the recorded call ``ev`` with and without the trajectory's query images; and,
    teacher-forced, its per-token columns (ΔH, KL and the top-5 alternatives of each think token; None
    regenerating)."""
    line, tok, vocab = ctx.line, ctx.tok, ctx.vocab
    sel = ctx.slices.get(ev.index, slice(0, 0))
    think = np.asarray(tok["think"][sel], dtype=bool)
    row = {"sample_id": line.sample_id, "trial": line.trial, "benchmark": line.benchmark,
           "paper_category": line.paper_category, "category": line.category, "step": ev.index,
           "state": ev.state, "n_images": ev.n_images, "n_query_images": ev.n_query_images,
           "n_tokens": int(len(think)), "n_think": int(think.sum()), "mode": ctx.mode, "semantics": ev.semantics,
           "model": line.model}
    with_imgs = ctx.run.sendable_messages(line, ev)
    if ctx.images is not None:
        ctx.images[0].use(ctx.images[1], image_shas(with_imgs))
    without = strip_query_images(with_imgs)  # the query images, by position (never by content)
    tokens = None
    if ctx.mode == "regenerate":
        await _regenerate_side(row, ev, tok, sel, think, without, ctx.backend, ctx.H_all, ctx.Hhi_all, vocab)
    else:
        tokens = await _teacher_forced_side(row, line, ev, tok, sel, think, with_imgs, without, ctx.backend, vocab,
                                            ctx.known_texts)
    row["dH"] = row["H_with"] - row["H_without"]
    if vocab:  # the interval the true ΔH lies in (per-token bounds averaged: the means are bounded the same way)
        row["vocab"] = int(vocab)
        row["dH_low"] = row["H_with"] - row["H_high_without"]
        row["dH_high"] = row["H_high_with"] - row["H_without"]
    if np.isfinite(row.get("H_exact_with", np.nan)) and np.isfinite(row.get("H_exact_without", np.nan)):
        row["dH_exact"] = row["H_exact_with"] - row["H_exact_without"]
        row["gap_with"] = row["H_exact_with"] - row["H_with"]
    return row, tokens


def bounds_by_step(steps):
    """Per step: the mean ΔH interval [mean dH_low, mean dH_high] (the bounds of the mean ΔH: each step's
    interval holds its true ΔH, so their means hold the true mean), whether it excludes 0 (``sign_robust``: +1 /
    -1 / 0), and how many of the step's ΔH are robust on their own, each way."""
    v = steps[np.isfinite(steps["dH_low"]) & np.isfinite(steps["dH_high"])]
    b = v.groupby("step").agg(dH_low=("dH_low", "mean"), dH_high=("dH_high", "mean"), n_bounded=("dH_low", "size"),
                              n_robust_positive=("dH_low", lambda x: int((x > 0).sum())),
                              n_robust_negative=("dH_high", lambda x: int((x < 0).sum()))).reset_index()
    b["sign_robust"] = np.select([b["dH_low"] > 0, b["dH_high"] < 0], [1, -1], 0)
    return b


def bounds_calibration(steps, tol: float = 1e-4):
    """Where the exact entropy is known (the in-process backend): per step and context, the exact value's distance
    above the grouped lower bound and below the upper bound (mean, median, 95th percentile, max) and the share
    of steps whose interval holds it (``covered``: must be 1; ``tol`` absorbs float32 storage). None without
    exact values."""

    rows = []
    for side in ("with", "without"):
        ex, lo, hi = f"H_exact_{side}", f"H_{side}", f"H_high_{side}"
        if ex not in steps or hi not in steps:
            continue
        v = steps[np.isfinite(steps[ex]) & np.isfinite(steps[hi])]
        for step, g in v.groupby("step"):
            below, above = (g[ex] - g[lo]).to_numpy(), (g[hi] - g[ex]).to_numpy()
            ok = (below >= -tol) & (above >= -tol)
            rows.append({"step": step, "context": side, "n": len(g), "gap_low_mean": below.mean(),
                         "gap_low_p50": np.median(below), "gap_low_p95": np.quantile(below, 0.95),
                         "gap_low_max": below.max(), "gap_high_mean": above.mean(), "gap_high_p50": np.median(above),
                         "gap_high_p95": np.quantile(above, 0.95), "gap_high_max": above.max(),
                         "covered": float(ok.mean()), "n_missed": int((~ok).sum())})
    return pd.DataFrame(rows) if rows else None


def vocab_of(backend) -> int | None:
    """The model's vocabulary size V for the entropy bounds: the backend's (SGLang native and scripted know it),
    else its model directory's config.json; None when neither says."""

    for b in getattr(backend, "backends", None) or [backend]:
        v = getattr(b, "vocab", None) or (model_vocab_size(b.model_dir) if getattr(b, "model_dir", None) else None)
        if v:
            return int(v)
    return None
