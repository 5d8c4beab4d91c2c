"""The work of ``python -m probes.fidelity`` once its arguments parse: probes/fidelity/cli.py holds the flags, the
package's docstring says what it does and writes."""
from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from agent.backends import make_backend
from agent.backends.base import BackendError, Continuation, SamplingParams, TokenArrays
from agent.backends.openai_compat import OpenAIBackend
from agent.cli import done
from agent.record import LlmCall
from agent.rundir import RunError, load_run, write_json
from agent.trajectory import recorded_sampling
from probes.session import RecordedPrompts, backend_for, run_async

log = logging.getLogger(__name__)

__all__ = ["fidelity_check", "check_servers", "chat_twin", "refusal", "mode_readings", "mode_verdict", "TOLERANCES",
           "PATH_TOKENS", "MODE_TOLERANCE", "MODE_SEPARATION", "fidelity_command"]

#: check -> (mean |Δ logprob| at most, max |Δ| at most, mean top-20 overlap at least)
TOLERANCES = {"warm": (0.02, 0.25, 0.95), "cold": (0.02, 0.25, 0.95), "local": (0.05, 1.0, 0.90),
              # one server, one model, two front doors: the same kernels, so the repeat tolerance (ours)
              "paths": (0.02, 0.25, 0.95)}
#: Greedy tokens generated on each path for the paths check (ours: enough to cover the first think tokens,
#: cheap next to a probe).
PATH_TOKENS = 16
#: The mode check reads generated (decode) logprobs against teacher-forced (prefill) ones. SGLang's deterministic
#: inference is close, not identical, between the two for Qwen3.5's hybrid layers at TP > 1 (the linear-attention
#: layers run a chunked scan in prefill and a recurrent update in decode; sglang#34159, #27869, issue #20509), so
#: the verdict's mean distance may be the server-vs-reference tolerance (ours), not the repeat one; and a token
#: decides only where the raw and scaled readings lie twice the repeat check's max |Δ| apart.
MODE_TOLERANCE = TOLERANCES["local"][0]
MODE_SEPARATION = 2 * TOLERANCES["warm"][1]


def _compare(a, b) -> dict:
    """|Δ logprob| of the scored tokens and top-20 overlap between two scorings of the same tokens."""
    A, B = TokenArrays.from_tokens(a.tokens, 20), TokenArrays.from_tokens(b.tokens, 20)
    if len(A) != len(B):
        raise BackendError(f"two scorings of one continuation returned {len(A)} and {len(B)} positions")
    d = np.abs(np.asarray(A.logprobs, np.float64) - np.asarray(B.logprobs, np.float64))
    ov = []
    for ra, rb in zip(np.asarray(A.top_ids), np.asarray(B.top_ids)):
        sa, sb = {int(x) for x in ra if x >= 0}, {int(x) for x in rb if x >= 0}
        ov.append(len(sa & sb) / max(len(sa), len(sb), 1))
    return {"n_tokens": int(len(d)), "max_abs": float(d.max()) if len(d) else 0.0,
            "mean_abs": float(d.mean()) if len(d) else 0.0, "overlap_mean": float(np.mean(ov)) if ov else 1.0,
            "overlap_min": float(np.min(ov)) if ov else 1.0}


def _pool(parts: list[dict]) -> dict:
    n = sum(p["n_tokens"] for p in parts)
    return {"calls": len(parts), "n_tokens": n, "max_abs": max((p["max_abs"] for p in parts), default=0.0),
            "mean_abs": sum(p["mean_abs"] * p["n_tokens"] for p in parts) / n if n else 0.0,
            "overlap_mean": sum(p["overlap_mean"] * p["n_tokens"] for p in parts) / n if n else 1.0,
            "overlap_min": min((p["overlap_min"] for p in parts), default=1.0)}


def _sample_calls(run, samples: int) -> list:
    out = []
    for summary in sorted(run.index, key=lambda ln: ln.key):
        call = next((c for c in summary.calls if c.n_query_images > 0), None)
        if call is None or not summary.tokens_file:
            continue
        try:  # a damaged sidecar is the probe's to skip and count, not a reason to stop before it starts
            run.tokens(summary, ["call"])
        except RunError as e:
            log.info(f"serving fidelity: {e}; checking another trajectory")
            continue
        out.append((summary, call.index))
        if len(out) >= samples:
            break
    return out


async def _two_paths(native, chat, msgs: list[dict], ev: LlmCall) -> tuple[dict, str | None]:
    """Greedy generations of the same messages on the native and the chat path: the comparison over the tokens
    both chose, and what disagreed (None when nothing did)."""

    base = recorded_sampling(ev)
    sp = SamplingParams(temperature=0.0, top_p=1.0, max_tokens=PATH_TOKENS, top_logprobs=20,
                        enable_thinking=base.enable_thinking, chat_template_kwargs=base.chat_template_kwargs)
    a = await native.generate(msgs, sp)
    b = await chat.generate(msgs, sp)
    ta, tb = list(a.tokens), list(b.tokens)
    # token ids where the chat reply carries them (SGLang's meta_info); by text where it does not (a router in
    # front passes only the OpenAI logprobs, whose tokens and alternatives are texts)
    by_text = any(t.id is None for t in tb)
    ia = [t.text for t in ta] if by_text else [t.id for t in ta]
    ib = [t.text for t in tb] if by_text else [t.id for t in tb]
    m = next((j for j, (x, y) in enumerate(zip(ia, ib)) if x != y), min(len(ia), len(ib)))
    if not m:
        part = {"n_tokens": 0, "max_abs": 0.0, "mean_abs": 0.0, "overlap_mean": 1.0, "overlap_min": 1.0}
    elif by_text:
        part = _compare_texts(ta[:m], tb[:m])
    else:
        part = _compare(SimpleNamespace(tokens=ta[:m]), SimpleNamespace(tokens=tb[:m]))
    part["prompt_tokens"] = {"native": a.usage.prompt_tokens, "chat": b.usage.prompt_tokens}
    part["shared_prefix"] = m
    part["by"] = "text" if by_text else "ids"
    notes = []
    if a.usage.prompt_tokens != b.usage.prompt_tokens:
        notes.append(f"prompt tokens differ (native {a.usage.prompt_tokens}, chat {b.usage.prompt_tokens}): the "
                     "server's chat template or image expansion is not the client's")
    if m == 0 and ia and ib:
        notes.append(f"the first greedy token differs (native {ia[0]!r}, chat {ib[0]!r})")
    return part, "; ".join(notes) or None


def mode_readings(generated, forced, temperature: float) -> tuple[np.ndarray, np.ndarray]:
    """Per decisive token: |generated − raw reading| and |generated − scaled reading| (both (n,) arrays). The raw
    reading is the teacher-forced logprob l; the scaled one l / T − logsumexp(top-k / T) over the teacher-forced
    top list (with l itself where the token is not in it)."""
    G, F = generated, forced
    n = min(len(G), len(F))
    keep = [i for i in range(n) if G.ids[i] == F.ids[i] and np.isfinite(G.logprobs[i]) and np.isfinite(F.logprobs[i])]
    d_raw, d_scaled = [], []
    for i in keep:
        lp = float(F.logprobs[i])
        row = F.top_logprobs[i, : int(F.counts[i])]
        ids = F.top_ids[i, : int(F.counts[i])]
        vals = row[np.isfinite(row)]
        if F.ids[i] not in ids:
            vals = np.append(vals, lp)
        z = vals / temperature
        scaled = lp / temperature - (z.max() + np.log(np.exp(z - z.max()).sum()))
        if abs(scaled - lp) < MODE_SEPARATION:
            continue
        d_raw.append(abs(float(G.logprobs[i]) - lp))
        d_scaled.append(abs(float(G.logprobs[i]) - scaled))
    return np.asarray(d_raw), np.asarray(d_scaled)


def mode_verdict(d_raw: np.ndarray, d_scaled: np.ndarray, temperature: float, recorded: str | None) -> dict:
    """The mode check's result from :func:`mode_readings` pooled over calls: ``server`` raw / scaled / neither /
    None (undecided), ``ok`` when it is the run's recorded mode or undecided."""
    out = {"temperature": temperature, "n_tokens": int(len(d_raw)), "recorded": recorded,
           "tolerance": {"mean_abs": MODE_TOLERANCE, "separation": MODE_SEPARATION}}
    if temperature in (0.0, 1.0):
        return {**out, "server": None, "ok": True, "skipped": f"the run sampled at T = {temperature:g}, where raw "
                                                                  "and scaled logprobs are the same"}
    if not len(d_raw):
        return {**out, "server": None, "ok": True, "skipped": f"no generated token where raw and scaled differ by "
                                                              f"{MODE_SEPARATION} nat (near-certain tokens)"}
    m_raw, m_scaled = float(d_raw.mean()), float(d_scaled.mean())
    server = ("raw" if m_raw <= MODE_TOLERANCE and m_raw < m_scaled else
              "scaled" if m_scaled <= MODE_TOLERANCE and m_scaled < m_raw else "neither")
    return {**out, "server": server, "mean_abs_raw": m_raw, "mean_abs_scaled": m_scaled, "ok": server == recorded}


async def _mode_call(backend, msgs: list[dict], ev: LlmCall) -> tuple[np.ndarray, np.ndarray, float]:
    """Generate at the recorded call's sampling, score the same tokens teacher-forced: the mode readings."""
    sp = recorded_sampling(ev)
    sp = SamplingParams(**{**sp.to_dict(), "max_tokens": PATH_TOKENS, "top_logprobs": 20, "stop": None})
    if sp.temperature in (0.0, 1.0):
        return np.zeros(0), np.zeros(0), sp.temperature
    out = await backend.generate(msgs, sp)
    ids = [int(i) for i in out.tokens.ids]
    if not ids or min(ids) < 0:  # a reply without token ids cannot be scored back
        return np.zeros(0), np.zeros(0), sp.temperature
    forced = await backend.score(msgs, Continuation(ids=ids), top_logprobs=20)
    return (*mode_readings(out.tokens, forced.tokens, sp.temperature), sp.temperature)


def _compare_texts(a: list, b: list) -> dict:
    """:func:`_compare` for tokens known by text only: |Δ logprob| of the chosen tokens, and the overlap of the
    top-20 alternatives' texts (SGLang's chat layer dedupes alternatives by text, so the native side's are too)."""
    d = np.abs(np.array([x.logprob for x in a], np.float64) - np.array([y.logprob for y in b], np.float64))
    ov = []
    for x, y in zip(a, b):
        sa, sb = {t.text for t in x.top}, {t.text for t in y.top}
        ov.append(len(sa & sb) / max(len(sa), len(sb), 1))
    return {"n_tokens": int(len(d)), "max_abs": float(d.max()), "mean_abs": float(d.mean()),
            "overlap_mean": float(np.mean(ov)), "overlap_min": float(np.min(ov))}


def text_only(msgs: list[dict]) -> list[dict]:
    """The messages without their image parts (vLLM scores them by token ids, over /v1/completions)."""
    return [{**m, "content": [p for p in m["content"] if p.get("type") == "text"]}
            if isinstance(m.get("content"), list) else m for m in msgs]


async def _vllm_call(backend, msgs: list[dict], ev: LlmCall, results: dict, modes: list) -> None:
    """The mode reading on one recorded call's text (ours: scored by token ids over /v1/completions, the route
    every vLLM server serves; agent/backends/vllm.py): the server generates at the call's sampling, scores those tokens
    twice (a warm pair) and its output logprobs are read against the scored ones (raw under --logprobs-mode
    raw_logprobs)."""
    sp = recorded_sampling(ev)
    sp = SamplingParams(**{**sp.to_dict(), "max_tokens": PATH_TOKENS, "top_logprobs": 20, "stop": None})
    out = await backend.generate(text_only(msgs), sp)
    ids = [int(i) for i in out.tokens.ids]
    if not ids or min(ids) < 0:
        return
    first = await backend.score(text_only(msgs), Continuation(ids=ids), top_logprobs=20)
    results["warm"].append(_compare(first, await backend.score(text_only(msgs), Continuation(ids=ids), top_logprobs=20)))
    if sp.temperature not in (0.0, 1.0):
        modes.append((*mode_readings(out.tokens, first.tokens, sp.temperature), sp.temperature))


async def _check_call(run, line, step, backend, reference, chat, flush, results, path_notes, summary,
                      modes=None) -> None:
    """The checks on one recorded call (its scored tokens appended to ``results``)."""
    ev = run.call_event(line, step)
    if getattr(backend, "name", "") == "vllm":  # the mode on the call's text (exact ids), then the checks with images
        await _vllm_call(backend, run.sendable_messages(line, ev), ev, results, modes if modes is not None else [])
        modes = None
    try:
        tok = run.tokens(line, ["call", "id", "text"])
    except RunError:  # an older sidecar without token texts
        tok = run.tokens(line, ["call", "id"])
    sel = tok["call"] == step
    ids = [int(i) for i in tok["id"][sel]]
    if not ids or min(ids) < 0:
        return
    msgs = run.sendable_messages(line, ev)
    texts = tok.get("text")
    # the text rides along for backends that cannot map ids back (the scripted fake), as in the entropy probe
    cont = Continuation(ids=ids, text=None if texts is None or any(t is None for t in texts[sel])
                        else "".join(texts[sel]))
    first = await backend.score(msgs, cont, top_logprobs=20)
    results["warm"].append(_compare(first, await backend.score(msgs, cont, top_logprobs=20)))
    if flush is not None:
        await flush()
        results["cold"].append(_compare(first, await backend.score(msgs, cont, top_logprobs=20)))
    if reference is not None:
        results["local"].append(_compare(first, await reference.score(msgs, cont, top_logprobs=20)))
    if modes is not None:
        modes.append(await _mode_call(backend, msgs, ev))
    if chat is not None:
        part, note = await _two_paths(backend, chat, msgs, ev)
        results["paths"].append(part)
        if note:
            path_notes.append(f"{summary.sample_id}#{summary.trial} call {step}: {note}")


def chat_twin(backend):
    """The OpenAI-compatible chat path of the SGLang server behind a native backend (None for other backends)."""
    if getattr(backend, "name", "") != "sglang" or not hasattr(backend, "url"):
        return None

    return OpenAIBackend(backend.url.removesuffix("/generate"), backend.model_arg, server="sglang",
                         logprob_mode=backend.logprob_mode, policy=backend.policy)


async def fidelity_check(run_dir, backend, *, samples: int = 8, reference=None, out_dir=None,
                         force: bool = False, chat=None, retokenize: bool = False) -> dict:
    """Run the checks; write ``fidelity.json``; return the report (``ok``: every check within its tolerance).
    ``chat``: the same server's chat path (:func:`chat_twin`) for the paths check."""
    run = load_run(run_dir)
    if not hasattr(backend, "score"):
        raise BackendError(f"{getattr(backend, 'name', backend)}: the fidelity check scores recorded tokens; this "
                           "backend cannot (use --backend sglang with --model-dir)")
    picked = _sample_calls(run, samples)
    if not picked:
        raise RunError(f"{run.path}: no image-bearing call with recorded tokens to check")
    results: dict[str, list] = {"warm": [], "cold": [], "local": [], "paths": []}
    path_notes: list[str] = []
    modes: list = []
    flush = getattr(backend, "flush_cache", None)

    # the prompt ids the run sent, as the probe that runs this check sends them (probes/session.py; --retokenize: none)
    recorded = RecordedPrompts(backend, off=retokenize)
    for summary, step in picked:
        line = run.full(summary)
        try:
            give_back = recorded.lend(run, line)
        except RunError:  # an unreadable record: this check tokenises; the probe names it when it gets there
            give_back = None
        try:
            await _check_call(run, line, step, backend, reference, chat, flush, results, path_notes, summary, modes)
        finally:
            if give_back is not None:
                give_back()
    checks, failed = _verdicts(results, path_notes)
    recorded_mode = run.header.backend.logprob_mode
    checks["mode"] = (mode_verdict(np.concatenate([m[0] for m in modes]), np.concatenate([m[1] for m in modes]),
                                   modes[0][2], recorded_mode) if modes else
                      {"skipped": "no call with token ids to generate from", "ok": True, "server": None,
                       "recorded": recorded_mode})
    if not checks["mode"]["ok"]:
        failed.append(_mode_failure(checks["mode"]))
    report = {"run_dir": str(run.path), "finished": time.time(), "endpoint": getattr(backend, "public", None),
              "calls": len(results["warm"]), "checks": checks, "ok": not failed, "failed": failed,
              "forced": bool(failed and force)}
    out = Path(out_dir) if out_dir else run.path / "probes" / "fidelity"
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "fidelity.json", report, indent=2)
    return report


def _verdicts(results: dict, path_notes: list[str]) -> tuple[dict, list[str]]:
    """Each scoring check pooled over the calls and held to its tolerance; the failures, one line each."""
    checks, failed = {}, []
    for name, parts in results.items():
        if not parts:
            checks[name] = {"skipped": {"cold": "the backend has no /flush_cache", "local":
                                        "no --reference-model-dir (the weights are not local)",
                                        "paths": "not an SGLang native backend, or --no-paths"}.get(name, "no call")}
            continue
        c = _pool(parts)
        mean_tol, max_tol, ov_tol = TOLERANCES[name]
        c["tolerance"] = {"mean_abs": mean_tol, "max_abs": max_tol, "overlap_mean": ov_tol}
        c["ok"] = c["mean_abs"] <= mean_tol and c["max_abs"] <= max_tol and c["overlap_mean"] >= ov_tol
        if name == "paths":
            c["prompt_tokens"] = [p["prompt_tokens"] for p in parts]
            c["by"] = sorted({p.get("by", "ids") for p in parts})  # ids (meta_info), or texts (behind a router)
            c["notes"] = path_notes
            c["ok"] = c["ok"] and not path_notes
        if not c["ok"]:
            failed.append(f"{name}: mean |Δlogprob| {c['mean_abs']:.3f} (≤ {mean_tol}), max {c['max_abs']:.3f} "
                          f"(≤ {max_tol}), top-20 overlap {c['overlap_mean']:.3f} (≥ {ov_tol})"
                          + "".join(f"; {n}" for n in (path_notes if name == "paths" else [])[:3]))
        checks[name] = c
    return checks, failed


def _mode_failure(m: dict) -> str:
    seen = (f"mean |Δ| to the raw reading {m['mean_abs_raw']:.3f}, to the scaled {m['mean_abs_scaled']:.3f} "
            f"over {m['n_tokens']} tokens at T = {m['temperature']:g}")
    if m["server"] == "neither":
        return (f"mode: the server's generated logprobs are neither raw nor scaled readings of its teacher-forced "
                f"ones ({seen}; ≤ {MODE_TOLERANCE} expected)")
    return (f"mode: the server returns {m['server']} logprobs but the run records {m['recorded']} ({seen}): "
            f"the run's entropies are not what its header says; rerun with --logprob-mode {m['server']}, or "
            f"relaunch the server with --logprob-mode {m['recorded']}")


async def check_servers(run_dir, backend, *, samples: int = 8, out_dir=None, force: bool = False, reference=None,
                        paths: bool = True, retokenize: bool = False) -> dict:
    """:func:`fidelity_check` on each server behind ``backend`` (several ``--endpoint``: each on its own, so a
    flush reaches the server that was scored), with the paths check on each SGLang server unless ``paths`` is
    false; one report (``ok`` when every server passes)."""
    members = list(getattr(backend, "backends", None) or [backend])
    reports = []
    for b in members:
        chat = chat_twin(b) if paths else None
        try:
            reports.append(await fidelity_check(run_dir, b, samples=samples, out_dir=out_dir, force=force,
                                                reference=reference, chat=chat, retokenize=retokenize))
        finally:
            if chat is not None:
                await chat.aclose()
    if len(reports) == 1:
        return reports[0]
    rep = {"servers": reports, "ok": all(r["ok"] for r in reports),
           "failed": [f"{r.get('endpoint')}: {f}" for r in reports for f in r["failed"]],
           "forced": force and not all(r["ok"] for r in reports)}
    out = Path(out_dir) if out_dir else Path(run_dir) / "probes" / "fidelity"
    write_json(out / "fidelity.json", rep, indent=2)
    return rep


def refusal(report: dict) -> str:
    failed = report["failed"]  # "check: ..." on one server, "ENDPOINT: check: ..." over several
    scoring = [f for f in failed if not re.match(r"^(\S+: )?mode: ", f)]
    why = "; ".join(failed)
    if not scoring:  # the mode check alone: the message says what to do
        return f"the server is not fit to be probed: {why}"
    return ("the server is not fit to be probed: scoring the same recorded tokens twice gave different "
            f"log-probabilities ({why}). A ΔH drawn from it would be noise. Look for a prefix-cache or image-cache "
            "issue on the server (restart it, try --disable-radix-cache), or pass --force to probe anyway (recorded)")


def fidelity_command(a) -> int:
    """``python -m probes.fidelity`` once its arguments parse."""

    async def go():
        run = load_run(a.run_dir)
        backend = backend_for(a, run.header)
        reference = None
        if a.reference_model_dir:
            reference = make_backend("local", model_dir=a.reference_model_dir, logprob_mode="raw")
        try:
            return await check_servers(a.run_dir, backend, samples=a.samples, reference=reference, out_dir=a.out,
                                       force=a.force, paths=not a.no_paths)
        finally:
            await backend.aclose()
            if reference is not None:
                await reference.aclose()

    rep, code = run_async(go(), "nothing")
    if code:
        return code
    for r in rep.get("servers") or [rep]:
        if "servers" in rep:
            print(f"{r.get('endpoint')}:")
        for name, c in r["checks"].items():
            if "skipped" in c:
                print(f"{name:5s}: skipped ({c['skipped']})")
            elif name == "mode":
                print(f"mode : {'ok  ' if c['ok'] else 'FAIL'} the server returns {c['server']} logprobs (the run "
                      f"records {c['recorded']}): mean |Δ| to the raw reading {c['mean_abs_raw']:.4f}, to the scaled "
                      f"{c['mean_abs_scaled']:.4f} over {c['n_tokens']} tokens at T = {c['temperature']:g}")
            else:
                print(f"{name:5s}: {'ok  ' if c['ok'] else 'FAIL'} mean |Δlogprob| {c['mean_abs']:.4f}, max "
                      f"{c['max_abs']:.4f}, top-20 overlap {c['overlap_mean']:.3f} (min {c['overlap_min']:.3f}) over "
                      f"{c['n_tokens']} tokens of {c['calls']} calls")
    out = Path(a.out) if a.out else Path(a.run_dir) / "probes" / "fidelity"
    if not rep["ok"]:
        log.error(f"error: {refusal(rep)}")
        done([f"{out}/fidelity.json"], "fix the server, then rerun; or --force")
        return 0 if a.force else 2
    done([f"{out}/fidelity.json"], f"python -m probes.entropy {a.run_dir}")
    return 0


