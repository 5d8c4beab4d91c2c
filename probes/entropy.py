"""The entropy probe (paper §3.2.2, B.4): think-segment entropy at step t with vs without the query images.

    python -m probes.entropy                                   # the embedded demo, end to end (random model!)
    python -m probes.entropy RUN_DIR [--mode regenerate|teacher-forced] [--backend sglang --endpoint URL
        --model-dir DIR | --backend local --model-dir DIR] [--concurrency 8] [--limit N] [--out DIR]

For every LLM call (step t) of every trajectory in RUN_DIR whose context held query images, τ_t is the
call's recorded messages (each step's reasoning included, as the agent saw it) and τ_t^IR the same
messages with the *query* image parts dropped (their ``<image_k>`` text identifiers kept; images that a
tool retrieved stay, paper B.5). Trajectories are selected by the shared rule of
:mod:`analysis.selection` (paper B.1, Table 10); the exclusion counts are printed and saved as
``exclusions.csv``. The probe must query the model that recorded the run (checked; ``--force``). H(τ) is the mean grouped-tail entropy (top-20 + one tail bin, nats; a lower
bound on the exact entropy) over the think tokens of the response; ΔH_t = H(τ_t) - H(τ_t^IR)
(positive: the images raise the entropy).

- ``regenerate`` (the paper's setting): H(τ_t) from the recorded response, H(τ_t^IR) from a new
  response sampled under τ_t^IR with the same sampling parameters and the same logprob semantics
  (checked: a scaled generation is never paired with a raw one).
- ``teacher-forced``: the recorded response scored under both τ_t and τ_t^IR (same tokens, both raw,
  lower variance; needs a backend that scores: ``local`` or ``sglang``). Also reports, per step, the
  mean over think tokens of KL(with || without) on the union of both top-20 supports plus a tail bin.

Where the backend computes exact entropy (in-process), the exact values and the gap of the grouped
estimate are reported too. Writes ``OUT/steps.jsonl`` (resumable: a rerun probes only missing steps),
``steps.parquet`` + ``steps.csv`` (one row per (trajectory, step)), in teacher-forced mode also
``tokens/<key>.parquet`` (per trajectory, per think token of each step: ΔH and KL, for the trajectory viewer), ``summary.csv`` (per step: n, mean
ΔH, 95% bootstrap CI, Wilcoxon signed-rank p; calls without think tokens are excluded and counted) and
the Figure 2(b) panel ``fig2b_entropy.png/.pdf``. OUT defaults to ``RUN_DIR/probes/entropy-<mode>``.
"""
from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from agent.backends import make_backend
from agent.backends.base import BackendError, Continuation, TokenArrays, model_vocab_size, top_matrix
from agent.backends.messages import ImageUsers, image_shas, strip_query_images
from agent.backends.spread import pin
from agent.cli import done, make_parser
from agent.http import dumps, loads
from agent.preflight import PreflightError
from agent.run import RunConfig, run
from agent.rundir import Run, RunError, close_fragment, load_run, output_lock, read_parquet, token_key
from agent.rundir.common import _atomic_write
from agent.trajectory import recorded_sampling
from analysis.entropy import (
    FORK_SHARE,
    entropy_high,
    entropy_histogram,
    forking_stats,
    forking_threshold,
    grouped_tail_entropy,
    token_influence,
)
from analysis.figures import fig2b_entropy, fig2b_forking, fig2b_kl, provenance_mark
from analysis.selection import select_trajectories
from analysis.stats import summarise_by
from probes.cli import (
    RecordedPrompts,
    add_backend_args,
    add_retokenize_arg,
    backend_for,
    probe_concurrency,
    probe_model_check,
    record_session,
    run_async,
    serving_hardware,
)
from probes.fidelity import check_servers, refusal

__all__ = ["probe_run", "main", "MODES", "TokenStore", "read_step_tokens"]

MODES = ("regenerate", "teacher-forced")
DEMO_BANNER = """\
==========================================================================================
 probes.entropy DEMO on the EMBEDDED DEFAULT: a tiny, RANDOMLY INITIALISED Qwen3.5 and the
 offline demo world. Every entropy and ΔH below is MEANINGLESS: the point is that the whole
 pipeline (collect ReAct trajectories -> strip images -> regenerate -> ΔH -> Figure 2(b)) runs.
 Run it on a served Qwen3.5 (README: "Probes") for real numbers.
=========================================================================================="""


def _think_mean(values: np.ndarray, think: np.ndarray) -> float:
    v = values[think]
    return float(np.add.reduce(v, dtype=np.float64)) / len(v) if len(v) else float("nan")


#: Alternatives kept per think token and context for the viewer's hover (teacher-forced probe; ours).
ALTERNATIVES = 5


def _alternatives(with_tokens, without_tokens, pos, known: set | None = None) -> dict:
    """The top-:data:`ALTERNATIVES` ids and logprobs of each think token under both contexts, and the texts of
    those ids (``texts``: {id: text}, decoded once per id by the backend's tokenizer). ``known``: the ids whose
    texts the trajectory's earlier steps already carry (updated here); only new ones are decoded and kept, since a
    trajectory's file holds one text table for all its steps (ours: most alternatives recur from step to step)."""

    known = set() if known is None else known
    out, texts = {}, {}
    for side, toks in (("w", with_tokens), ("o", without_tokens)):
        arr = TokenArrays.from_tokens(toks, ALTERNATIVES)
        out[f"{side}_ids"] = np.asarray(arr.top_ids)[pos, :ALTERNATIVES].astype(np.int64)
        out[f"{side}_lp"] = np.asarray(arr.top_logprobs)[pos, :ALTERNATIVES].astype(np.float32)
    if isinstance(with_tokens, TokenArrays) and isinstance(without_tokens, TokenArrays):
        # both sides: one sort, then each id once (not np.unique: numpy 2.4's took ~0.55 ms on these ~9,000 ids,
        # the sort ~0.03; ours)
        u = np.sort(np.concatenate([out["w_ids"].ravel(), out["o_ids"].ravel()]))
        if len(u):
            u = u[np.concatenate(([True], u[1:] != u[:-1]))]
        need = [i for i in u[u >= 0].tolist() if i not in known]  # ascending, each id once
        dec = getattr(with_tokens, "_decode", None) or getattr(without_tokens, "_decode", None)
        texts = {i: (dec(i) if dec else "") for i in need}
    else:  # the object path carries each alternative's text
        for toks in (with_tokens, without_tokens):
            for t in (toks[int(p)] for p in pos):
                for a in t.top[:ALTERNATIVES]:
                    if a.id is not None and int(a.id) not in known and int(a.id) not in texts:
                        texts[int(a.id)] = a.text
    known.update(texts)
    out["texts"] = texts
    return out


_COLUMNS = ("pos", "dH", "kl", "w_ids", "w_lp", "o_ids", "o_lp")


class TokenStore:
    """The teacher-forced probe's per-token results, one ``tokens/<key>.parquet`` per trajectory (columns step, pos,
    dH, kl), not one file per step (50,870 of them at paper scale; 1.1 ms of CPU each; ours).

    While a trajectory is probed, each finished step is appended to ``tokens/<key>.partial.bin`` (one flushed
    binary record, before the step's row reaches steps.jsonl), so an interrupt keeps every finished step's tokens;
    when the trajectory is done its steps go into the Parquet file (merged with the steps an earlier session kept)
    and the partial file is removed. A probe that starts finds the partial files an interrupted one left (and an
    older probe's ``.partial.jsonl``) and folds them in first (:meth:`recover`). At most one partial file per
    trajectory in flight exists at a time."""

    def __init__(self, d: Path):
        self.d = d

    def path(self, key: str) -> Path:
        return self.d / f"{key}.parquet"

    def append(self, key: str, step: int, tok: dict, fh=None):
        """One step's arrays onto the trajectory's partial file (``fh``: its open handle, returned): one framed
        binary record, flushed (:func:`_frame`; ours: the arrays' bytes as they are, ~0.05 ms a step, where the
        same record as a JSON line cost ~0.6 ms)."""
        if fh is None:
            self.d.mkdir(parents=True, exist_ok=True)
            fh = open(self.d / f"{key}{PARTIAL}", "ab")
        fh.write(_frame(step, tok))
        fh.flush()
        return fh

    def commit(self, key: str, steps: dict[int, dict], *, partial_too: bool = False) -> None:
        """Write the trajectory's steps (with the ones already in its file, and with ``partial_too`` those in its
        partial file: a recovery; a probe's own partial file holds just ``steps``), then drop the partial file."""


        partials = [self.d / f"{key}{PARTIAL}", self.d / f"{key}{_PARTIAL_JSONL}"]
        merged = self._read(key)
        if partial_too:
            for partial in partials[::-1]:  # an older probe's JSON lines first, then this format's records
                merged.update(self._read_partial(partial))
        merged.update(steps)
        if merged:
            order = sorted(merged)
            cols = {"step": np.concatenate([np.full(len(merged[s]["pos"]), s, np.int32) for s in order]),
                    "pos": np.concatenate([np.asarray(merged[s]["pos"], np.int32) for s in order]),
                    "dH": np.concatenate([np.asarray(merged[s]["dH"], np.float32) for s in order]),
                    "kl": np.concatenate([np.asarray(merged[s]["kl"], np.float32) for s in order])}
            texts = {}
            if all("w_ids" in merged[s] for s in order):  # the alternatives (probes from before: none)
                for c, dt in (("w_ids", np.int32), ("w_lp", np.float32), ("o_ids", np.int32), ("o_lp", np.float32)):
                    flat = np.concatenate([np.asarray(merged[s][c], dt).reshape(-1, ALTERNATIVES) for s in order])
                    cols[c] = pa.FixedSizeListArray.from_arrays(pa.array(flat.ravel()), ALTERNATIVES)
                for s in order:  # int keys throughout (the readers below convert theirs)
                    texts.update(merged[s].get("texts") or {})
            table = pa.table(cols)
            if texts:  # the alternatives' texts, once per id, in the file's metadata
                table = table.replace_schema_metadata({"alt_texts": dumps(texts, int_keys=True)})
            sink = pa.BufferOutputStream()
            # dictionary-encoding only the step column: with every column dictionary-encoded (pyarrow's default) the
            # write took ~4x the CPU and the file was larger (ours, ad hoc: 9.8 -> 2.2 ms and 1.02 -> 0.65 MB for a
            # 9,000-token trajectory)
            # (no column statistics: nothing filters these files by value; ~7 % of the write)
            pq.write_table(table, sink, compression="zstd", use_dictionary=["step"], write_statistics=False)
            self.d.mkdir(parents=True, exist_ok=True)
            _atomic_write(self.path(key), sink.getvalue().to_pybytes())
        for partial in partials:
            partial.unlink(missing_ok=True)

    def recover(self) -> int:
        """Fold the partial files an interrupted probe left into their trajectories' files; returns how many."""
        n = 0
        keys = sorted({p.name[: -len(suffix)] for suffix in (PARTIAL, _PARTIAL_JSONL)
                       for p in (self.d.glob(f"*{suffix}") if self.d.is_dir() else [])})
        for key in keys:
            self.commit(key, {}, partial_too=True)
            n += 1
        return n

    def _read(self, key: str) -> dict:
        p = self.path(key)
        if not p.exists():
            return {}

        t = read_parquet(p)
        step = t.column("step").to_numpy()
        cols = {c: t.column(c).to_numpy() for c in ("pos", "dH", "kl")}
        for c in ("w_ids", "w_lp", "o_ids", "o_lp"):
            if c in t.column_names:
                cols[c] = np.asarray(t.column(c).combine_chunks().flatten()).reshape(-1, ALTERNATIVES)
        meta = (t.schema.metadata or {}).get(b"alt_texts")
        texts = {int(k): v for k, v in json.loads(meta).items()} if meta else {}
        return {int(s): {**{c: v[step == s] for c, v in cols.items()}, "texts": texts} for s in np.unique(step)}

    @staticmethod
    def _read_partial(p: Path) -> dict:
        out = {}
        if not p.exists():
            return out
        data = p.read_bytes()
        if p.name.endswith(_PARTIAL_JSONL):  # a probe from before the binary records
            for raw in data.splitlines():
                try:
                    r = loads(raw)
                    out[int(r["step"])] = {**{c: r[c] for c in _COLUMNS if c in r},
                                           "texts": {int(k): v for k, v in (r.get("texts") or {}).items()}}
                except (ValueError, KeyError, TypeError):  # a torn last line: that step's row was never written
                    continue
            return out
        at = 0
        while at < len(data):
            got = _unframe(data, at)
            if got is None:  # a torn last record (an interrupted write): that step's row was never written
                print(f"{p}: a torn record at byte {at} ignored (its step is probed again)", file=sys.stderr)
                break
            at, step, rec = got
            out[step] = rec
        return out


#: A trajectory's partial token results: framed binary records (:func:`_frame`); ``.partial.jsonl`` is the format
#: of probes from before, still folded in.
PARTIAL = ".partial.bin"
_PARTIAL_JSONL = ".partial.jsonl"
_MAGIC = b"MMTS"


def _frame(step: int, tok: dict) -> bytes:
    """One step's token results as a record: magic, the header's length (uint32 LE), the header (JSON: step, each
    column's dtype and shape, the alternatives' texts) and the columns' bytes in header order (ours)."""
    arrays = [(c, np.ascontiguousarray(tok[c])) for c in _COLUMNS if c in tok]
    head = dumps({"step": int(step), "cols": [[c, a.dtype.str, list(a.shape)] for c, a in arrays],
                  "texts": tok.get("texts") or {}}, int_keys=True)
    return b"".join([_MAGIC, len(head).to_bytes(4, "little"), head, *(a.tobytes() for _, a in arrays)])


def _unframe(data: bytes, at: int):
    """(next offset, step, {column: array, "texts": {id: text}}) of the record at ``at``; None if it is torn."""
    if data[at:at + 4] != _MAGIC or len(data) < at + 8:
        return None
    n = int.from_bytes(data[at + 4:at + 8], "little")
    try:
        head = loads(data[at + 8:at + 8 + n])
        at += 8 + n
        rec = {}
        for c, dt, shape in head["cols"]:
            a = np.frombuffer(data, dtype=np.dtype(dt), count=int(np.prod(shape, dtype=np.int64)), offset=at)
            rec[c] = a.reshape(shape)
            at += a.nbytes
        rec["texts"] = {int(k): v for k, v in head["texts"].items()}
        return at, int(head["step"]), rec
    except (ValueError, KeyError, TypeError):
        return None


def read_step_tokens(tokens_dir: Path, key: str) -> dict[int, dict]:
    """{step: {"pos", "dH", "kl"}} of one trajectory from a teacher-forced probe's ``tokens/`` (the per-trajectory
    file; a probe from before it wrote ``<key>__c<step>.parquet`` per step, read too)."""
    out = TokenStore(tokens_dir)._read(key)
    if not out:

        for p in tokens_dir.glob(f"{key}__c*.parquet"):
            try:
                step = int(p.stem.rsplit("__c", 1)[1])
            except ValueError:
                continue
            t = read_parquet(p)
            out[step] = {c: t.column(c).to_numpy() for c in ("pos", "dH", "kl")}
    return out


def _has_text(run: Run, line: dict) -> bool:
    """Whether the line's sidecar keeps token texts (format 2 does; older ones may not)."""

    try:
        return "text" in pq.ParquetFile(run.path / line["tokens_file"]).schema_arrow.names
    except (OSError, KeyError, TypeError, ValueError):
        return False


def _call_slices(call: np.ndarray) -> dict:
    """{call index: slice of its rows} (a sidecar's rows are grouped by call, in order)."""
    if len(call) and np.all(call[1:] >= call[:-1]):
        start = np.r_[0, np.flatnonzero(call[1:] != call[:-1]) + 1]
        ends = np.r_[start[1:], len(call)]
        return {int(call[a]): slice(int(a), int(b)) for a, b in zip(start.tolist(), ends.tolist())}
    return {int(c): np.flatnonzero(call == c) for c in np.unique(call)}


def _serving_totals(rows: list[dict]) -> dict:
    """Over every step row: requests, prompt tokens, those the server's prefix cache served (SGLang's
    ``cached_tokens``), and the summed request time (``server_seconds``: request-seconds, batched requests
    overlapping; the GPU-seconds held are probe.json's ``cost``, :func:`probes.cli.record_session`)."""
    rs = [r for r in rows if r.get("prompt_tokens") is not None]
    prompt = sum(int(r["prompt_tokens"]) for r in rs)
    cached = sum(int(r.get("cached_tokens") or 0) for r in rs)
    return {"requests": len(rs), "prompt_tokens": prompt, "cached_tokens": cached,
            "cached_share": round(cached / prompt, 4) if prompt else None,
            "server_seconds": round(sum(float(r.get("latency_s") or 0.0) for r in rs), 2)}


async def _probe_step(run: Run, line: dict, ev: dict, tok: dict, backend, mode: str, H_all=None, slices=None,
                      vocab: int | None = None, Hhi_all=None, known_texts: set | None = None,
                      images: tuple | None = None) -> dict:
    sel = (slices or _call_slices(tok["call"])).get(ev["index"], slice(0, 0))
    think = np.asarray(tok["think"][sel], dtype=bool)
    row = {"sample_id": line["sample_id"], "trial": line["trial"], "benchmark": line["benchmark"],
           "paper_category": line.get("paper_category"), "category": line.get("category"), "step": ev["index"],
           "state": ev["state"], "n_images": ev["n_images"], "n_query_images": ev.get("n_query_images", 0),
           "n_tokens": int(len(think)), "n_think": int(think.sum()), "mode": mode, "semantics": ev.get("semantics"),
           "model": line.get("model")}
    with_imgs = run.sendable_messages(line, ev)
    if images is not None:  # (the probe's image users, this trajectory's images)
        images[0].use(images[1], image_shas(with_imgs))
    without = strip_query_images(with_imgs)  # the query images, by position (never by content)
    if mode == "regenerate":
        H = H_all[sel] if H_all is not None else grouped_tail_entropy(tok["top_logprobs"][sel])
        row["H_with"] = _think_mean(H, think)
        if vocab:
            hi = Hhi_all[sel] if Hhi_all is not None else entropy_high(tok["top_logprobs"][sel], H, vocab)
            row["H_high_with"] = _think_mean(hi, think)
        ex = tok["exact_entropy"][sel][think]  # NaN where the backend had no full distribution (a server)
        row["H_exact_with"] = float(np.mean(ex, dtype=np.float64)) if len(ex) and np.isfinite(ex).all() else float("nan")
        sp = recorded_sampling(ev)
        out = await backend.generate(without, sp)
        if ev.get("semantics") and out.semantics.label() != ev["semantics"]:
            raise BackendError(f"regenerated logprobs are {out.semantics.label()} but the record's are {ev['semantics']}: "
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
        if vocab:
            row["H_high_without"] = _think_mean(entropy_high(top, h2, vocab), th2)
        if out.exact_entropy is not None:
            row["H_exact_without"] = _think_mean(np.asarray(out.exact_entropy, dtype=np.float64), th2)
        row["regenerated_text"] = out.text[:2000]
        # what the server did for it: prompt tokens, those served from its prefix cache, and the request's time
        # (summed per probe in probe.json: the GPU time a figure costs, and whether the request order paid off)
        row["prompt_tokens"], row["cached_tokens"] = int(out.usage.prompt_tokens), int(out.usage.cached_tokens)
        row["latency_s"] = round(float(out.latency_s), 4)
    else:
        ids = np.asarray(tok["id"][sel]).astype(np.int64, copy=False).tolist()  # Python ints, by one C-level pass
        if not ids or min(ids) < 0:
            raise RunError(f"{line['sample_id']} step {ev['index']}: the record has no token ids "
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
        # the same quantities the adaptive image release computes online (analysis.entropy.token_influence)
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
        # per think token: the entropy change and the KL influence (the trajectory viewer colours tokens by them),
        # and the top-5 alternatives under both contexts (shown on hover)
        row["_tokens"] = {"pos": inf["pos"], "dH": inf["dH"].astype(np.float32), "kl": inf["kl"].astype(np.float32),
                          **_alternatives(a.tokens, b.tokens, inf["pos"], known_texts)}
    row["dH"] = row["H_with"] - row["H_without"]
    if vocab:  # the interval the true ΔH lies in (per-token bounds averaged: the means are bounded the same way)
        row["vocab"] = int(vocab)
        row["dH_low"] = row["H_with"] - row["H_high_without"]
        row["dH_high"] = row["H_high_with"] - row["H_without"]
    if np.isfinite(row.get("H_exact_with", np.nan)) and np.isfinite(row.get("H_exact_without", np.nan)):
        row["dH_exact"] = row["H_exact_with"] - row["H_exact_without"]
        row["gap_with"] = row["H_exact_with"] - row["H_with"]
    return row


def _forking(rows: list[dict], mode: str):
    """Per step: the share of forking think tokens (the run's top 20 % by entropy with the images, arXiv
    2506.01939's high-entropy minority: one threshold for the whole run) with and without the query images, and
    the forking tokens' part of ΔH, ``dH_fork`` (ΔH = dH_fork + dH_rest, both per think token of the step;
    teacher-forced: Σ over the tokens that fork with the images of their H with − without, / n; regenerate:
    each response's own forking tokens, Σ H / n with − the same without), with a bootstrap CI: whether the
    images move a few forking tokens or every token (ours). Also written per (trajectory, step) into the rows.
    None when no row carries histograms (a probe from before this was recorded)."""


    hist_rows = [r for r in rows if isinstance(r.get("fork"), dict)]
    if not hist_rows:
        return None
    j, theta = forking_threshold(r["fork"].get("w") for r in hist_rows)
    per = []
    for r in hist_rows:
        nw, fw, sw, dw = forking_stats(r["fork"].get("w"), j)
        no, fo, so, _ = forking_stats(r["fork"].get("o"), j)
        # the forking tokens' part of ΔH (per think token of the step: ΔH = dH_fork + dH_rest)
        if not nw or not no:
            d = float("nan")
        elif mode == "teacher-forced":
            d = dw / nw
        else:
            d = sw / nw - so / no
        r["share_fork_with"] = fw / nw if nw else float("nan")
        r["share_fork_without"] = fo / no if no else float("nan")
        r["dH_fork"] = d
        dh = r.get("dH")
        r["dH_rest"] = float(dh) - d if isinstance(dh, (int, float)) and np.isfinite(dh) else float("nan")
        per.append({"step": r["step"], "share_fork_with": r["share_fork_with"],
                    "share_fork_without": r["share_fork_without"], "dH_fork": d, "dH_rest": r["dH_rest"],
                    "n_fork": fw})
    df = pd.DataFrame(per)
    out = summarise_by(df[np.isfinite(df["dH_fork"])], "step", "dH_fork")
    if out.empty:  # no step has forking tokens on both sides: the shares still say where they are
        out = pd.DataFrame(columns=["step", "n", "mean", "ci_low", "ci_high", "wilcoxon_p"])
    out = out.rename(columns={"mean": "dH_fork", "ci_low": "fork_ci_low", "ci_high": "fork_ci_high", "n": "n_steps"})
    shares = df.groupby("step").agg(share_fork_with=("share_fork_with", "mean"),
                                    share_fork_without=("share_fork_without", "mean"),
                                    dH_rest=("dH_rest", "mean"), forking_tokens=("n_fork", "sum")).reset_index()
    out = shares.merge(out, on="step", how="left")
    out["threshold_nats"] = theta
    return out


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


#: Methods whose trajectories the entropy probe reads (the paper probes ReAct; Removal@k runs have steps
#: without query images by design, which the selection rule handles).
SUPPORTED_METHODS = ("react",)


async def probe_run(run_dir, *, mode: str = "regenerate", out_dir=None, **kw) -> dict:
    """Probe every image-bearing step of the run; returns {"steps": DataFrame, "summary": DataFrame, "out": Path}.
    One probe per output directory at a time (a second is refused: both would append the same steps)."""
    out = Path(out_dir) if out_dir else Path(run_dir) / "probes" / f"entropy-{mode}"
    with output_lock(out, "entropy probe"):
        return await _probe_run(run_dir, mode=mode, out_dir=out, **kw)


async def _probe_run(run_dir, *, mode: str = "regenerate", backend=None, out_dir=None, concurrency: int = 8,
                     limit: int | None = None, progress: bool = True, force: bool = False,
                     include_unparsed: bool = False, hardware: dict | None = None, fidelity: dict | None = None,
                     retokenize: bool = False) -> dict:

    if mode not in MODES:
        raise ValueError(f"--mode must be one of {MODES}")
    run = load_run(run_dir)
    if run.header.get("method") not in SUPPORTED_METHODS:
        raise RunError(f"{run.path}: the entropy probe reads ReAct runs (paper §3.2.2); this run is "
                       f"{run.header.get('label') or run.header.get('method')}")
    ident = await probe_model_check(run, backend, force=force)
    out = Path(out_dir) if out_dir else run.path / "probes" / f"entropy-{mode}"
    out.mkdir(parents=True, exist_ok=True)
    steps_path = out / "steps.jsonl"
    done = set()
    if steps_path.exists():
        close_fragment(steps_path)  # an interrupted append left a fragment: new rows start on a line of their own
        for raw in steps_path.read_bytes().splitlines():
            try:
                r = loads(raw)
                done.add((r["sample_id"], r["trial"], r["step"]))
            except (ValueError, KeyError, TypeError):  # a torn last line: that step is probed again
                continue
    # the run's index (line summaries) decides what to probe; each trajectory's whole line and token columns
    # are read when its turn comes and dropped when its steps are done: memory stays bounded at any run size
    index = sorted(run.index, key=lambda ln: (ln["sample_id"], ln["trial"]))[: limit or None]
    lines, exclusions = select_trajectories(index, include_unparsed=include_unparsed)
    exclusions.to_csv(out / "exclusions.csv", index=False)
    pending = []
    for line in lines:
        steps = [c["index"] for c in line.get("calls") or []
                 if c.get("n_query_images", 0) > 0 and (line["sample_id"], line["trial"], c["index"]) not in done]
        if steps:
            pending.append((line, steps))
    n_steps = sum(len(st) for _, st in pending)
    print("trajectories entering the analysis (rule: analysis/selection.py):\n"
          + exclusions.to_string(index=False), file=sys.stderr)
    print(f"entropy probe ({mode}): {len(lines)} trajectories, {n_steps} image-bearing steps to probe, "
          f"{len(done)} already done -> {out}", file=sys.stderr)

    bar = tqdm(total=n_steps, desc=f"entropy/{mode}", unit="step", disable=not progress, file=sys.stderr,
               mininterval=1.0)
    sem = asyncio.Semaphore(concurrency)
    failures = []
    columns = (["call", "think", "top_logprobs", "exact_entropy"] if mode == "regenerate"
               else ["call", "think", "id", "text"])

    async def trajectory(summary, steps):
        async with sem:  # at most `concurrency` trajectories (and requests) at a time
            pin(backend, (summary["sample_id"], summary["trial"]))  # one server per trajectory (its prefix cache)
            try:
                line = run.full(summary)
                if not line.get("tokens_file"):
                    raise RunError("no token sidecar (the run recorded no tokens)")
                # the token texts only for a backend that scores by text (the scripted fake): the model backends score
                # the ids, and decoding the text column cost ~0.3 ms a step (ours)
                want = columns if mode == "regenerate" else [c for c in columns if c != "text"] + (
                    ["text"] if getattr(backend, "scores_text", False) and _has_text(run, line) else [])
                tok = run.tokens(line, want)
                # the prompt ids the run sent, lent to the backend while this trajectory is probed: its requests send
                # them again instead of tokenising the history (probes/cli.py RecordedPrompts)
                give_back = recorded.lend(run, line)
            except RunError as e:
                failures.append(f"{summary['sample_id']}/t{summary['trial']}: {e}")
                bar.update(len(steps))
                return
            H_all = grouped_tail_entropy(tok["top_logprobs"]) if mode == "regenerate" else None
            # the upper bounds from the grouped entropies just computed (the same bound; ours: 1.6 -> 1.05 ms for 10,000
            # float32 rows, hot)
            Hhi_all = entropy_high(tok["top_logprobs"], H_all, vocab) if mode == "regenerate" and vocab else None
            slices = _call_slices(tok["call"])
            events = {e["index"]: e for e in line["events"] if e["type"] == "llm_call"}
            key, fh, kept_tokens = token_key(line["sample_id"], line["trial"]), None, {}
            known_texts = set()  # the alternatives' ids whose texts this trajectory's steps already carry
            my_images = set()    # the stored images its steps send
            try:
                for step in steps:
                    ev = events.get(step)
                    try:
                        if ev is None:
                            raise RunError(f"no llm_call event for step {step}")
                        row = await _probe_step(run, line, ev, tok, backend, mode, H_all, slices, vocab, Hhi_all,
                                                known_texts, (image_users, my_images))
                    except (BackendError, RunError) as e:
                        failures.append(f"{line['sample_id']}/t{line['trial']} step {step}: {e}")
                        row = None
                    if row is not None:
                        t = row.pop("_tokens", None)
                        if t is not None:  # the step's tokens first (its partial file), then its row
                            fh = store.append(key, step, t, fh)
                            kept_tokens[step] = t
                        # each step as it finishes, one whole line, flushed: an interrupt (Ctrl-C, a kill) keeps every
                        # finished step and the rerun probes only the rest
                        sink.write(dumps(row) + b"\n")
                        sink.flush()
                        kept[0] += 1
                    bar.update(1)
            finally:
                give_back()
                image_users.done(my_images)
                if fh is not None:
                    fh.close()
            if kept_tokens:  # the trajectory is done: its tokens into one file (an interrupt leaves the partial one)
                store.commit(key, kept_tokens)

    getattr(backend, "prepare", lambda m: None)(mode)  # what the requests will need, loaded once
    vocab = vocab_of(backend)
    if not vocab:
        print("entropy bounds: the model's vocabulary size is unknown (no config.json): steps carry the grouped "
              "lower bound only, no upper bound or ΔH interval", file=sys.stderr)
    store = TokenStore(out / "tokens")
    if store.recover():  # an interrupted probe's finished steps, folded into their trajectories' files
        print(f"{out / 'tokens'}: folded the token results of an interrupted probe into their trajectories' files",
              file=sys.stderr)
    kept = [0]
    image_users = ImageUsers()
    recorded = RecordedPrompts(backend, off=retokenize)
    sink = open(steps_path, "ab")
    started, t0 = time.time(), time.perf_counter()
    try:
        work = [trajectory(line, steps) for line, steps in pending]
        await asyncio.gather(*work)
    except BaseException:
        print(f"entropy probe stopped: {kept[0]} steps finished in this session are kept in {steps_path} "
              f"({len(done) + kept[0]} in all); the rerun probes the {n_steps - kept[0]} others", file=sys.stderr)
        raise
    finally:
        sink.close()
        bar.close()
    rows = []
    for raw in (steps_path.read_bytes().splitlines() if steps_path.exists() else []):
        try:
            rows.append(loads(raw))
        except ValueError:  # a torn line (an interrupted append): skipped here, probed again on the next run
            continue
    rows = [r for r in rows if isinstance(r, dict) and {"sample_id", "trial", "step"} <= r.keys()]
    # one row per step, whatever wrote twice (an older probe without the lock): the last one counts, said so
    by_key = {(r["sample_id"], r["trial"], r["step"]): r for r in rows}
    if len(by_key) < len(rows):
        print(f"{steps_path}: {len(rows) - len(by_key)} duplicate step row(s) ignored (the last of each is kept)",
              file=sys.stderr)
    rows = list(by_key.values())

    cost = record_session(out / "probe.json", hardware or serving_hardware(backend), started,
                          time.perf_counter() - t0, kept[0])
    (out / "probe.json").write_text(json.dumps({"run_dir": str(run.path), "mode": mode, "finished": time.time(),
                                                "serving": _serving_totals(rows), "cost": cost,
                                                "fidelity": fidelity or {"skipped": "not run (probe_run called "
                                                                                    "directly)"},
                                                "model": ident, "forced_model_mismatch": force,
                                                "include_unparsed": include_unparsed,
                                                "prompt_ids": recorded.summary(),
                                                "failures": failures}, indent=2))
    fork_summary = _forking(rows, mode)
    steps = pd.DataFrame([{k: v for k, v in r.items() if k != "fork"} for r in rows])
    for c in ("H_with", "H_without", "dH", "H_exact_with", "H_exact_without", "kl_with_without", "dH_exact", "gap_with",
              "H_high_with", "H_high_without", "dH_low", "dH_high"):
        if c in steps:  # null (a non-finite value in JSON) is NaN
            steps[c] = pd.to_numeric(steps[c], errors="coerce").astype(float)
    if steps.empty:
        raise RunError(f"{run.path}: no step with query images was probed ({len(failures)} failed"
                       + (f"; first: {failures[0]}" if failures else "") + ")")
    keep = {(ln["sample_id"], ln["trial"]) for ln in lines}  # a rerun after a selection change drops stale rows
    steps = steps[[(a, b) in keep for a, b in zip(steps["sample_id"], steps["trial"])]]
    steps = steps.sort_values(["sample_id", "trial", "step"]).reset_index(drop=True)
    if "dH_low" in steps:  # +1 / -1: the interval holds only positive / negative ΔH; 0: it holds 0
        steps["sign_robust"] = np.select([steps["dH_low"] > 0, steps["dH_high"] < 0], [1, -1], 0)
    steps.to_parquet(out / "steps.parquet", index=False)
    steps.to_csv(out / "steps.csv", index=False)
    valid = steps[np.isfinite(steps["dH"])]
    summary = summarise_by(valid, "step", "dH")
    counts = steps.groupby("step").agg(n_steps=("dH", "size"), excluded_no_think=("dH", lambda x: int((~np.isfinite(x)).sum())),
                                       H_with=("H_with", "mean"), H_without=("H_without", "mean"))
    summary = summary.merge(counts.reset_index(), on="step", how="right")
    if "kl_with_without" in steps:
        kl = summarise_by(steps[np.isfinite(steps["kl_with_without"])], "step", "kl_with_without")
        kl = kl.rename(columns={"mean": "kl_with_without", "ci_low": "kl_ci_low", "ci_high": "kl_ci_high", "n": "kl_n"})
        summary = summary.merge(kl[["step", "kl_with_without", "kl_ci_low", "kl_ci_high", "kl_n"]], on="step", how="left")
    if "dH_exact" in steps:
        summary = summary.merge(steps.groupby("step")[["dH_exact", "gap_with"]].mean().reset_index(), on="step", how="left")
    if "dH_low" in steps:
        summary = summary.merge(bounds_by_step(steps), on="step", how="left")
        cal = bounds_calibration(steps)
        if cal is not None:
            cal.to_csv(out / "bounds_calibration.csv", index=False)
            bad = cal[cal["covered"] < 1.0]
            if len(bad):  # cannot happen for a correct bound: said loudly, never hidden
                print(f"warning: the entropy bounds missed the exact value at {int(bad['n_missed'].sum())} step(s) "
                      f"(bounds_calibration.csv); please report it", file=sys.stderr)
    summary.to_csv(out / "summary.csv", index=False)
    if fork_summary is not None:
        fork_summary.to_csv(out / "forking.csv", index=False)

    model = (ident or {}).get("served_model") or (run.index[0].get("model") if run.index else None) or "model"
    mark = provenance_mark([run.header])
    fig2b_entropy(summary, out / "fig2b_entropy", title=f"Figure 2(b): ΔH per step ({model}, {mode})", mark=mark)
    if fork_summary is not None and len(fork_summary):
        fig2b_forking(fork_summary, summary, out / "fig2b_forking",
                      title=f"Forking tokens (top {FORK_SHARE:.0%} by entropy; {model}, {mode})", mark=mark)
    if "kl_with_without" in summary and np.isfinite(summary["kl_with_without"]).any():
        fig2b_kl(summary, out / "fig2b_kl_influence", title=f"Image influence per step ({model}, teacher-forced)",
                 mark=mark)
    for f in failures[:10]:
        print(f"failed: {f}", file=sys.stderr)
    return {"steps": steps, "summary": summary, "out": out, "failures": failures}


def _print_summary(s) -> None:
    cols = [c for c in ("step", "n", "mean", "ci_low", "ci_high", "dH_low", "dH_high", "sign_robust", "wilcoxon_p",
                        "excluded_no_think", "H_with", "H_without", "kl_with_without", "dH_exact", "gap_with") if c in s]
    print(s[cols].to_string(index=False, float_format=lambda v: f"{v:.4f}"))


async def _demo(args) -> int:

    print(DEMO_BANNER, flush=True)
    out = Path(args.demo_dir)
    print(f"\n[1/2] collecting {args.demo_samples} ReAct trajectories on the demo benchmark -> {out}", flush=True)
    await run(RunConfig(method="react", out=str(out), benchmark="demo", limit=args.demo_samples, t_max=4,
                        max_tokens=24, concurrency=1, seed=0, progress=not args.no_progress), [])
    print(f"\n[2/2] probing every image-bearing step ({args.mode})", flush=True)

    backend = make_backend("local")
    try:
        # the tiny random model never emits a valid action: the paper's rule would exclude every trajectory
        from probes.fidelity import check_servers

        # the serving-fidelity check first, as on a server (in-process: the warm repeat only; probes/fidelity.py)
        rep = await check_servers(out, backend, samples=args.demo_samples)
        warm = rep["checks"]["warm"]
        print(f"serving fidelity: {'ok' if rep['ok'] else 'FAILED'} (warm repeat: max |Δlogprob| "
              f"{warm.get('max_abs', float('nan')):.2g}; cold, local and paths need a server) -> "
              f"{out}/probes/fidelity/fidelity.json", flush=True)
        fidelity = {"ok": rep["ok"], "forced": False, "failed": rep["failed"],
                    "report": str(out / "probes" / "fidelity" / "fidelity.json")}
        print("(demo: --include-unparsed, since the random model's first calls never parse)", flush=True)
        res = await probe_run(out, mode=args.mode, backend=backend, progress=not args.no_progress,
                              include_unparsed=True, fidelity=fidelity)
    finally:
        await backend.aclose()
    _print_summary(res["summary"])
    print(f"\nwrote {res['out']}/steps.parquet, summary.csv, forking.csv, bounds per step; fig2b_entropy.png/.pdf "
          "(with the bound band), fig2b_forking.png/.pdf")
    print("(random weights: every number above is meaningless)")
    return 0


async def _fidelity_first(args, backend) -> dict:
    """The serving-fidelity check before a probe (probes/fidelity.py): refused (PreflightError, exit 2) when a
    check fails, unless --force; skipped (and said so in probe.json) with --skip-fidelity and for backends that
    cannot score (the OpenAI-compatible chat path). In-process and scripted models get the warm check only."""

    members = list(getattr(backend, "backends", None) or [backend])
    if args.skip_fidelity:
        return {"skipped": "--skip-fidelity"}
    # the OpenAI-compatible chat path has no teacher-forced scoring (its score() refuses)
    cannot = [getattr(b, "name", "?") for b in members if getattr(b, "name", "") == "openai"
              or not callable(getattr(b, "score", None))]
    if cannot:
        return {"skipped": f"the backend cannot score recorded tokens ({cannot[0]})"}
    out = Path(args.out).parent / "fidelity" if args.out else None
    rep = await check_servers(args.run_dir, backend, out_dir=out, force=args.force, retokenize=args.retokenize)
    if not rep["ok"]:
        if not args.force:
            raise PreflightError(refusal(rep))
        print(f"warning: --force: {refusal(rep)}", file=sys.stderr)
    return {"ok": rep["ok"], "forced": rep.get("forced", False), "failed": rep["failed"],
            "report": str((out or Path(args.run_dir) / "probes" / "fidelity") / "fidelity.json")}


def main(argv=None) -> int:

    ap = make_parser("python -m probes.entropy", __doc__, [
        "python -m probes.entropy                                   # the embedded demo (random model)",
        "python -m probes.entropy runs/react-27b --mode teacher-forced --backend sglang --endpoint http://gpu:30000 "
        "--model-dir /models/Qwen3.5-27B"])
    ap.add_argument("run_dir", nargs="?", help="a ReAct run directory of python -m agent.run (none: the embedded demo)")
    ap.add_argument("--mode", default="regenerate", choices=MODES,
                    help="regenerate = the paper's (resample under τ^IR); teacher-forced = score the recorded tokens")
    add_backend_args(ap)
    add_retokenize_arg(ap)
    ap.add_argument("--force", action="store_true", help="probe with a model other than the run's, or a server that "
                                                          "failed the fidelity check (both recorded)")
    ap.add_argument("--skip-fidelity", action="store_true",
                    help="do not run the serving-fidelity check first (probes/fidelity.py; recorded in probe.json)")
    ap.add_argument("--include-unparsed", action="store_true",
                    help="keep trajectories whose first call did not parse (the paper excludes them; recorded)")
    ap.add_argument("--concurrency", type=int, default=None,
                    help="trajectories in flight (default: 128 per model server, 8 in-process; probes/cli.py says why)")
    ap.add_argument("--limit", type=int, help="probe the first N trajectories only")
    ap.add_argument("--out", help="output dir (default: RUN_DIR/probes/entropy-MODE)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--demo-dir", default="runs/demo-entropy", help="demo: where the demo run is written")
    ap.add_argument("--demo-samples", type=int, default=3, help="demo: how many demo questions")
    args = ap.parse_args(argv)
    if not args.run_dir:
        rc, code = run_async(_demo(args), "finished steps and trajectories")
        return code or rc

    async def go():
        run = load_run(args.run_dir)
        backend = backend_for(args, run.header)
        try:
            from probes.cli import serving_hardware

            hw = serving_hardware(backend, gpus_per_server=args.gpus_per_server, serving_dir=args.serving_dir)
            # the model first: a server of another model would fail the fidelity check for the wrong reason
            await probe_model_check(run, backend, force=args.force)
            fidelity = await _fidelity_first(args, backend)
            return await probe_run(args.run_dir, mode=args.mode, backend=backend, out_dir=args.out, hardware=hw,
                                   fidelity=fidelity,
                                   concurrency=probe_concurrency(args, backend), limit=args.limit, progress=not args.no_progress,
                                   force=args.force, include_unparsed=args.include_unparsed,
                                   retokenize=args.retokenize)
        finally:
            await backend.aclose()

    res, code = run_async(go(), "finished steps")
    if code:
        return code
    _print_summary(res["summary"])
    out = res["out"]
    done([f"{out}/ (steps.parquet, steps.csv, summary.csv, exclusions.csv, probe.json, fig2b_entropy.png/.pdf)"],
         f"python -m probes.removal {args.run_dir}   |   python -m analysis.report --react {args.run_dir}")
    return 1 if res["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
