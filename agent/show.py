"""Look at a run: a trajectory in the terminal, or the whole run as self-contained HTML pages.

    python -m agent.show RUN_DIR                                  # the samples: status, answer, gold, grade
    python -m agent.show RUN_DIR demo_3 [--trial 0] [--reasoning] # one trajectory, call by call
    python -m agent.show RUN_DIR --html run.html [--limit N]      # HTML (no server, no network): run.html,
                                                                  # run-p2.html, … (--page-size trajectories each)

The terminal view prints each LLM call with its state and branch span, the images it saw (query and
retrieved, by hash), its reasoning (first line, unless ``--reasoning``), its visible text, the parsed
action or why it was rejected, the tool calls with their observations, folds, branch spans and the budget
used. The HTML page lists the samples (filter by status, grade, benchmark, id) and, per sample, the event
timeline with main and branch spans nested; each call shows its exact messages with image thumbnails (the
images that call saw, embedded once per page; those over :data:`EMBED_PX` pixels on a side downscaled, the
originals being in ``RUN/images/``), its tool calls and observations (collapsible), and its
think tokens coloured by their grouped-tail entropy — or, where the entropy probe ran teacher-forced on this
run, by ΔH and by the KL(with ‖ without) influence of the images (the step's ΔH is shown for either mode).
Trajectories are embedded gzip-compressed and rendered only when opened; a run of more than ``--page-size``
trajectories is written as several pages, each listing every trajectory (filters see the whole run; one on
another page opens there), so the writer's memory and every page's size stay bounded at paper scale.
"""
from __future__ import annotations

import base64
import csv
import gzip
import html
import io
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

from analysis.entropy import entropy_bounds, grouped_tail_entropy
from analysis.figures import provenance_mark
from probes.entropy import read_step_tokens

from .backends.base import model_vocab_size
from .backends.scripted import ScriptedBackend
from .backends.tiny_model import default_tiny_dir
from .cli import done, make_parser
from .rundir import Run, RunError, load_run, token_key
from .rundir.grades import read_grades

__all__ = ["sample_table", "render_text", "build_html", "run_summary", "main"]


# ---------------------------------------------------------------------------- shared data
def _grades(run: Run) -> tuple[dict, str]:
    """{(sample, trial): grade} from the run's judge output (LLM judge first), and which judge."""
    for name in ("llm", "exact"):
        p = run.path / f"judge-{name}.jsonl"
        if p.exists():
            out = {}
            for raw in p.read_text().splitlines():
                try:
                    r = json.loads(raw)
                    out[(r["sample_id"], r["trial"])] = r["grade"]
                except (ValueError, KeyError):
                    continue
            return out, name
    return {}, ""


def _probe_steps(run: Run) -> tuple[dict, str | None]:
    """{(sample, trial, step): ΔH} from the entropy probe, and its mode (teacher-forced preferred)."""
    for mode in ("teacher-forced", "regenerate"):
        p = run.path / "probes" / f"entropy-{mode}" / "steps.jsonl"
        if p.exists():
            out = {}
            for raw in p.read_text().splitlines():
                try:
                    r = json.loads(raw)
                    out[(r["sample_id"], r["trial"], r["step"])] = r.get("dH")
                except (ValueError, KeyError):
                    continue
            return out, mode
    return {}, None


def _grounding_labels(run: Run) -> dict:
    """{(sample, trial): {step: {category, reasons}}} from the grounding annotator (probes/grounding/labels.jsonl)."""
    p = run.path / "probes" / "grounding" / "labels.jsonl"
    out: dict = {}
    if not p.exists():
        return out
    for raw in p.read_bytes().splitlines():
        try:
            r = json.loads(raw)
            out[(r["sample_id"], r["trial"])] = {
                int(st["step"]): {"category": st.get("category"),
                                  "reasons": [st[k] for k in sorted(st) if k.startswith("reason") and st[k]]}
                for st in r.get("steps") or []}
        except (ValueError, KeyError, TypeError):  # a torn line: that trajectory shows no labels
            continue
    return out


def _removal_outcomes(run: Run) -> dict:
    """{(sample, trial): [{k, replay_correct, replayed, status, error}]} from the step-k removal replays, with the
    original's grade under ``original``."""

    p = run.path / "probes" / "removal" / "outcomes.csv"
    out: dict = {}
    if not p.exists():
        return out
    with open(p, newline="") as f:
        for r in csv.DictReader(f):
            try:
                key = (r["sample_id"], int(r["trial"]))
                rc = r.get("replay_correct")
                out.setdefault(key, []).append({
                    "k": int(r["k"]), "correct": None if rc in ("", None) else rc == "True",
                    "original": r.get("original_correct") == "True", "replayed": r.get("replayed") == "True",
                    "status": r.get("replay_status") or "", "error": r.get("error") or ""})
            except (KeyError, ValueError):
                continue
    for v in out.values():
        v.sort(key=lambda x: x["k"])
    return out


def run_summary(run: Run) -> dict:
    """The landing pane's numbers: statuses, accuracy per judge, calls and tokens, and which probes ran."""

    idx = run.index
    statuses = Counter(ln["status"] for ln in idx)

    judges = {}
    for name in ("llm", "exact"):
        grades, label = {}, name
        for r in read_grades(run.path / f"judge-{name}.jsonl"):  # torn lines skipped
            if "sample_id" in r and "trial" in r and "grade" in r:
                grades[(r["sample_id"], r["trial"])] = r["grade"]  # the latest grade of each
                label = r.get("judge") or label
        if not grades:
            continue
        n = len(grades)
        judges[label] = {"graded": n, "correct": sum(g == "CORRECT" for g in grades.values()),
                         "accuracy": round(100.0 * sum(g == "CORRECT" for g in grades.values()) / n, 1) if n else None}
    calls = [c for ln in idx for c in ln.get("calls") or []]
    probes = {}
    pd_ = run.path / "probes"
    for d in sorted(pd_.iterdir()) if pd_.is_dir() else []:
        if not d.is_dir():
            continue
        if d.name.startswith("entropy-") and (d / "steps.jsonl").exists():
            probes[d.name] = f"{sum(1 for _ in (d / 'steps.jsonl').open('rb'))} steps probed"
        elif d.name == "grounding" and (d / "labels.jsonl").exists():
            probes[d.name] = f"{sum(1 for _ in (d / 'labels.jsonl').open('rb'))} trajectories annotated"
        elif d.name == "removal" and (d / "outcomes.csv").exists():
            probes[d.name] = f"{max(0, sum(1 for _ in (d / 'outcomes.csv').open('rb')) - 1)} replays (trajectory x k)"
        else:
            probes[d.name] = "present"
    if (run.header.get("image_release") or {}).get("policy"):
        probes["adaptive image release"] = "online (release_probe events in each trajectory)"
    return {"trajectories": len(idx), "statuses": dict(statuses), "judges": judges, "llm_calls": len(calls),
            "mean_calls": round(len(calls) / len(idx), 2) if idx else None,
            "prompt_tokens": sum(int(c.get("prompt_tokens") or 0) for c in calls),
            "completion_tokens": sum(int(c.get("completion_tokens") or 0) for c in calls),
            "tool_calls": sum(int(ln.get("n_tool_calls") or 0) for ln in idx), "probes": probes,
            "method": run.header.get("label"), "trials": run.header.get("trials")}


def sample_table(run: Run):
    """One row per (sample, trial): status, calls, answer, gold, grade."""

    grades, judge = _grades(run)
    rows = [{"sample_id": ln["sample_id"], "trial": ln["trial"], "benchmark": ln.get("benchmark"),
             "status": ln["status"], "calls": ln.get("n_calls"), "answer": ln.get("answer", ""), "gold": ln.get("gold", ""),
             "grade": grades.get((ln["sample_id"], ln["trial"]), "")} for ln in run.index]
    df = pd.DataFrame(rows)
    df.attrs["judge"] = judge
    return df.sort_values(["sample_id", "trial"]).reset_index(drop=True) if len(df) else df


def _short(text: str, n: int) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= n else text[: n - 1] + "…"


# ---------------------------------------------------------------------------- terminal
def render_text(run: Run, line: dict, *, reasoning: bool = False, observation_chars: int = 400) -> str:
    """A readable rendering of one trajectory (plain text)."""
    h = run.header
    t_max = (h.get("budgets") or {}).get("t_max", "?")
    grades, judge = _grades(run)
    out = [f"{line['sample_id']} / trial {line['trial']}  [{line.get('method')}{'/' + line['variant'] if line.get('variant') else ''}]"
           f"  model {line.get('model')}  status {line['status']}"
           + (f"  grade {grades.get((line['sample_id'], line['trial']))} ({judge})" if grades else ""),
           f"question: {_short(line.get('question'), 300)}",
           f"gold: {line.get('gold')}   answer: {line.get('answer') or '-'}"
           + (f"   error: {line.get('error')}" if line.get("error") else ""),
           "query images: " + (", ".join(f"{k}={v[:12]}" for k, v in (line.get("query_images") or {}).items()) or "none"), ""]
    depth = 0
    for ev in line.get("events") or []:
        pad = "  " * depth
        t = ev["type"]
        if t == "llm_call":
            imgs = ev.get("image_hashes") or []
            u = ev.get("usage") or {}
            flags = "".join(f" [{f}]" for f in ("correction", "forced") if ev.get(f))
            out.append(f"{pad}#{ev['index']}/{t_max} {ev['state']}{' ' + ev['branch'] if ev.get('branch') else ''}{flags}"
                       f"  images {len(imgs)} (query {ev.get('n_query_images', 0)}: "
                       f"{', '.join(x[:8] for x in imgs) or '-'})  prompt {u.get('prompt_tokens')} tok, "
                       f"out {ev.get('n_tokens')} ({ev.get('think_tokens')} think)")
            r = (ev.get("reasoning") or "").strip()
            if r:
                out.append(f"{pad}  reasoning: {r if reasoning else _short(r.splitlines()[0], 160) + (' …' if len(r.splitlines()) > 1 else '')}")
            if (ev.get("text") or "").strip():
                out.append(f"{pad}  text: {_short(ev['text'], 400)}")
            act = ev.get("action") or {}
            if ev.get("action_error"):
                out.append(f"{pad}  REJECTED: {ev['action_error']}")
            elif act:
                desc = act.get("kind")
                if act.get("kind") == "tool_call":
                    desc += f" {act.get('name') or ''}"
                if act.get("kind") == "answer":
                    desc += f": {act.get('answer')}"
                if act.get("kind") == "subtask":
                    st = act.get("subtask") or {}
                    desc += f" [{st.get('description')}] images {st.get('assigned_images')}"
                if act.get("fold"):
                    f = act["fold"]
                    desc += f"  fold {f['range']} removed {f['removed']}" + (f" anomaly {f['anomaly']}" if f["anomaly"] else "")
                out.append(f"{pad}  action: {desc}")
        elif t == "tool_call":
            res = ("ok" if ev.get("ok") else "FAILED") + (", cached" if ev.get("cache_hit") else "")
            imgs = ev.get("result_images") or []
            out.append(f"{pad}  -> {ev['name']}({_short(json.dumps(ev.get('args'), ensure_ascii=False), 160)}) {res}"
                       + (f", {len(imgs)} result images" if imgs else ""))
            out.append(f"{pad}     {_short(ev.get('observation'), observation_chars)}")
        elif t == "branch_begin":
            out.append(f"{pad}┌ branch {ev['branch']}: {ev.get('description')}  assigned {ev.get('assigned_images')}")
            depth += 1
        elif t == "branch_end":
            depth = max(0, depth - 1)
            out.append(f"{'  ' * depth}└ {ev['branch']} ends ({ev.get('reason')}, {ev.get('steps')} steps): "
                       f"{_short(ev.get('message'), 300)}")
        elif t == "init_end":
            for k, v in (ev.get("descriptions") or {}).items():
                out.append(f"{pad}init {k}: {_short(v, 200)}")
        elif t == "release_probe":
            v = ev.get("influence")
            out.append(f"{pad}  release probe ({ev.get('signal')}): influence "
                       f"{'n/a' if v is None else f'{v:.4g}'} {'<' if ev.get('below') else '>='} ε={ev.get('threshold'):g}, "
                       f"streak {ev.get('streak')}"
                       + (f" -> RELEASE: no query images from step {ev.get('release_step')} on"
                          if ev.get("decision") == "release" else " -> keep"))
        elif t == "final_answer":
            out.append(f"{pad}ANSWER{' (forced)' if ev.get('forced') else ''}: {ev.get('answer')}")
        elif t == "error":
            out.append(f"{pad}ERROR {ev.get('kind')}: {ev.get('message')}")
    out.append(f"\n{line.get('n_calls')} LLM calls of {t_max}; tools {line.get('tool_calls')}; "
               f"{line.get('generated_tokens')} tokens generated ({line.get('think_tokens')} think)")
    ir = line.get("image_release")
    if ir:
        out.append(f"adaptive image release ({ir.get('signal')} < {ir.get('threshold'):g} for {ir.get('patience')} steps; "
                   f"{ir.get('threshold_source')}): " + (f"detected at step {ir['detect_step']}, images removed from step "
                   f"{ir['release_step']} on" if ir.get("release_step") else "never released")
                   + f"; {ir.get('probes')} probes, {ir.get('scoring_calls')} scoring calls, {ir.get('probe_seconds')} s "
                   "(not counted in T_max)")
    return "\n".join(out)


# ---------------------------------------------------------------------------- HTML
#: Images larger than this (pixels on the longer side) are embedded downscaled (JPEG, quality 85; ours): a 322 KB
#: photo is ~430 KB of base64 in the page, its 768-pixel copy ~60 KB; the originals stay in RUN/images/.
EMBED_PX = 768


def _image_uri(run: Run, sha: str, cache: dict, missing: list, max_px: int | None = None) -> str | None:
    if sha in cache:
        return cache[sha]
    p = run.image_path(sha)
    if p is None:
        missing.append(sha)
        cache[sha] = None
        return None
    data, ext = p.read_bytes(), p.suffix.lstrip(".").replace("jpg", "jpeg")
    max_px = EMBED_PX if max_px is None else max_px
    if max_px:


        try:
            with Image.open(io.BytesIO(data)) as im:
                if max(im.size) > max_px:
                    im = im.convert("RGB")
                    im.thumbnail((max_px, max_px))
                    buf = io.BytesIO()
                    im.save(buf, "JPEG", quality=85)
                    data, ext = buf.getvalue(), "jpeg"
        except OSError:  # unreadable here: embedded as stored (the browser says what it can)
            pass
    cache[sha] = f"data:image/{ext};base64," + base64.b64encode(data).decode()
    return cache[sha]


def _call_tokens(run: Run, line: dict, tf_dir: Path | None) -> dict:
    """Per call, its think tokens as columns: text, H (centinats), and where the teacher-forced probe ran on
    this run ΔH (centinats) and KL (millinats). Integers compress well; the colour scale needs no more."""

    if not line.get("tokens_file"):
        return {}
    try:
        try:  # an adaptive-release run carries its online per-token KL / ΔH (agent/methods/release.py)
            tok = run.tokens(line, ["call", "text", "think", "top_logprobs", "release_kl", "release_dH"])
        except RunError:
            tok = run.tokens(line, ["call", "text", "think", "top_logprobs"])
    except RunError:
        return {}
    if "text" not in tok:  # a record from before token texts were kept
        return {}
    H = grouped_tail_entropy(tok["top_logprobs"])
    vocab = _run_vocab(run)
    H_hi = None
    if vocab:  # the upper bound of each token's exact entropy (analysis.entropy.entropy_bounds), for the hover

        H_hi = entropy_bounds(tok["top_logprobs"], vocab)[1]
    out = {}
    probed = {}
    if tf_dir is not None:  # the teacher-forced probe's per-token ΔH / KL of this trajectory (one file)

        probed = read_step_tokens(tf_dir, token_key(line["sample_id"], line["trial"]))
    for c in np.unique(tok["call"]):
        idx = np.flatnonzero(tok["call"] == c)
        think = tok["think"][idx].astype(bool)
        col = {"text": ["" if t is None else str(t) for t in tok["text"][idx][think]],
               "H": np.rint(H[idx][think] * 100).astype(int).tolist()}
        if H_hi is not None:
            col["Hhi"] = np.rint(H_hi[idx][think] * 100).astype(int).tolist()
        t = probed.get(int(c))
        if t is None and "release_kl" in tok and np.isfinite(tok["release_kl"][idx]).any():
            col["dH"] = [None if not np.isfinite(v) else int(round(v * 100)) for v in tok["release_dH"][idx][think]]
            col["kl"] = [None if not np.isfinite(v) else int(round(v * 1000)) for v in tok["release_kl"][idx][think]]
        elif t is not None:
            pos = np.asarray(t["pos"])
            full = {"dH": np.full(len(idx), np.nan), "kl": np.full(len(idx), np.nan)}
            ok = (pos >= 0) & (pos < len(idx))
            for name in full:
                full[name][pos[ok]] = np.asarray(t[name])[ok]
            col["dH"] = [None if not np.isfinite(v) else int(round(v * 100)) for v in full["dH"][think]]
            col["kl"] = [None if not np.isfinite(v) else int(round(v * 1000)) for v in full["kl"][think]]
            if "w_ids" in t:  # the top-5 under both contexts, per think token: [[text, per mille], …] each side
                col["alt"] = _alternatives_of(t, pos, ok, len(idx), think)
        out[int(c)] = col
    return out


def _run_vocab(run: Run) -> int | None:
    """The run's model vocabulary size (for the entropy upper bound), from its model directory; None if unknown."""

    b = run.header.get("backend") or {}
    if b.get("kind") == "scripted":

        return ScriptedBackend.vocab
    md = b.get("model_dir")
    if not md and (b.get("kind") == "local" or b.get("embedded_tiny_model")):

        md = default_tiny_dir()
    return model_vocab_size(md) if md else None


def _alternatives_of(t: dict, pos, ok, n: int, think) -> list:
    """Per think token of a call: ``[with, without]``, each a list of ``[text, probability in per mille]``."""
    texts = t.get("texts") or {}
    rows: list = [None] * n
    for j in np.flatnonzero(ok):
        sides = []
        for side in ("w", "o"):
            ids, lps = t[f"{side}_ids"][j], t[f"{side}_lp"][j]
            sides.append([[texts.get(int(i), f"#{int(i)}"), int(round(float(np.exp(lp)) * 1000))]
                          for i, lp in zip(ids, lps) if int(i) >= 0 and np.isfinite(lp)])
        rows[int(pos[j])] = sides
    return [rows[i] for i in np.flatnonzero(think)]


def _sample_detail(run: Run, line: dict, images: dict, missing: list, dH: dict, tf_dir: Path | None,
                   with_tokens: bool = True, grounding: dict | None = None, removal: dict | None = None) -> dict:
    msgs = []
    for m in line.get("messages") or []:
        c = m.get("content")
        parts = []
        if isinstance(c, list):
            for p in c:
                if isinstance(p, dict) and p.get("type") == "image":
                    sha = p.get("sha256")
                    if sha:
                        _image_uri(run, sha, images, missing)
                    parts.append({"img": sha, "url": p.get("url")})
                else:
                    parts.append({"text": (p or {}).get("text", "")})
        else:
            parts.append({"text": c or ""})
        msgs.append({"role": m.get("role"), "parts": parts, "reasoning": m.get("reasoning_content")})
    for h in (line.get("query_images") or {}).values():
        _image_uri(run, h, images, missing)
    events = []
    for ev in line.get("events") or []:
        e = {k: v for k, v in ev.items() if k not in ("sampling",)}
        if ev["type"] == "llm_call":
            e["dH"] = dH.get((line["sample_id"], line["trial"], ev["index"]))
        events.append(e)
    return {"events": events, "messages": msgs, "tokens": _call_tokens(run, line, tf_dir) if with_tokens else {},
            "question": line.get("question"), "gold": line.get("gold"), "answer": line.get("answer"),
            "query_images": line.get("query_images"), "error": line.get("error"), "status": line["status"],
            "grounding": (grounding or {}).get((line["sample_id"], line["trial"])) or {},
            "removal": (removal or {}).get((line["sample_id"], line["trial"])) or []}


#: ``--tokens auto`` embeds the coloured think tokens for runs up to this many trajectories (ours: at ~1,000
#: think tokens per call a trajectory's token columns take ~50-100 KB in the page, its messages ~10 KB)
AUTO_TOKENS = 300
#: Trajectories per HTML page (ours): a page of this many holds ~25 MB at paper-shaped lines without tokens, and
#: writing it holds one page's details and images at a time, so the writer's memory and each page's size stay
#: bounded at any run size (scripts/bench_viewer.py measures both at 5,087 trajectories).
PAGE_SIZE = 200


def page_files(out_path: Path, n_pages: int) -> list[Path]:
    """The page files: ``OUT.html`` first, then ``OUT-p2.html``, ``OUT-p3.html``… beside it."""
    return [out_path] + [out_path.with_name(f"{out_path.stem}-p{i}{out_path.suffix}") for i in range(2, n_pages + 1)]


def build_html(run_dir, out_path, *, limit: int | None = None, sample_ids: list[str] | None = None,
               tokens: str = "auto", page_size: int = PAGE_SIZE) -> dict:
    """Write the self-contained page(s); returns sizes (bytes, samples, images, pages) for the caller to report.

    Up to ``page_size`` trajectories go in one file; a larger run is written as several (``OUT.html``,
    ``OUT-p2.html``, …), each self-contained (its trajectories and their images) and each listing *every*
    trajectory, so filtering sees the whole run and a trajectory on another page opens there (one click).
    ``tokens``: ``all`` embeds every call's think tokens (coloured by H / ΔH / KL), ``none`` none, ``auto``
    all when at most :data:`AUTO_TOKENS` trajectories are written, else none (the page says so)."""
    if tokens not in ("auto", "all", "none"):
        raise ValueError(f"tokens must be auto, all or none, not {tokens!r}")
    if page_size < 1:
        raise ValueError(f"page_size must be at least 1, not {page_size}")
    run = load_run(run_dir)
    grades, judge = _grades(run)
    dH, mode = _probe_steps(run)
    tf_dir = run.path / "probes" / "entropy-teacher-forced" / "tokens"
    tf_dir = tf_dir if tf_dir.is_dir() else None
    has_release = bool((run.header.get("image_release") or {}).get("policy"))
    lines = sorted(run.index, key=lambda ln: (ln["sample_id"], ln["trial"]))  # summaries; whole lines one at a time
    if sample_ids:
        lines = [ln for ln in lines if ln["sample_id"] in set(sample_ids)]
    lines = lines[: limit or None]
    with_tokens = tokens == "all" or (tokens == "auto" and len(lines) <= AUTO_TOKENS)
    grounding, removal = _grounding_labels(run), _removal_outcomes(run)
    out_path = Path(out_path)
    chunks = [lines[i:i + page_size] for i in range(0, len(lines), page_size)] or [[]]
    files = page_files(out_path, len(chunks))
    samples = []
    for i, chunk in enumerate(chunks):
        for ln in chunk:
            samples.append({"key": f"{ln['sample_id']}__t{ln['trial']}", "id": ln["sample_id"], "trial": ln["trial"],
                            "status": ln["status"], "benchmark": ln.get("benchmark"), "category": ln.get("paper_category"),
                            "grade": grades.get((ln["sample_id"], ln["trial"]), ""), "calls": ln.get("n_calls"),
                            "answer": _short(ln.get("answer"), 80), "gold": _short(ln.get("gold"), 80),
                            "page": files[i].name})
    h = run.header

    pages = [{"file": f.name, "first": c[0]["sample_id"] if c else "", "last": c[-1]["sample_id"] if c else "",
              "n": len(c)} for f, c in zip(files, chunks)]
    meta = {"run": str(run.path), "label": h.get("label"), "model": (h.get("model") or {}).get("served_model"),
            "t_max": (h.get("budgets") or {}).get("t_max"), "judge": judge, "probe_mode": mode,
            "has_token_probe": tf_dir is not None or has_release, "mark": provenance_mark([h]), "benchmark": h.get("benchmark"),
            "n_lines": len(run.index), "shown": len(lines), "tokens": with_tokens, "summary": run_summary(run),
            "pages": pages}
    samples_js = _js(samples)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    total, n_images, missing = 0, 0, []
    for i, (f, chunk) in enumerate(zip(files, chunks)):  # one page's details and images in memory at a time
        images: dict = {}
        details = {}
        for ln in chunk:
            blob = json.dumps(_sample_detail(run, run.full(ln), images, missing, dH, tf_dir, with_tokens, grounding,
                                             removal), ensure_ascii=False, default=str, separators=(",", ":"))
            details[f"{ln['sample_id']}__t{ln['trial']}"] = base64.b64encode(gzip.compress(blob.encode(), 6)).decode()
        page = (_TEMPLATE.replace("__TITLE__", html.escape(f"{h.get('label')} — {run.path.name}"
                                                           + (f" (page {i + 1} of {len(files)})" if len(files) > 1 else "")))
                .replace("__META__", _js({**meta, "page": i + 1, "this_file": f.name}))
                .replace("__SAMPLES__", samples_js)
                .replace("__DETAILS__", _js(details)).replace("__IMAGES__", _js({k: v for k, v in images.items() if v})))
        f.write_text(page, encoding="utf-8")
        total += f.stat().st_size
        n_images += sum(1 for v in images.values() if v)
        del details, images, page
    for stale in out_path.parent.glob(f"{out_path.stem}-p*{out_path.suffix}"):  # pages of an earlier, larger write
        if stale not in files and stale.stem[len(out_path.stem) + 2:].isdigit():
            stale.unlink()
    return {"path": str(out_path), "bytes": total, "samples": len(samples), "images": n_images,
            "missing_images": sorted(set(missing)), "tokens": with_tokens, "pages": [str(f) for f in files],
            "largest_page_bytes": max(f.stat().st_size for f in files)}


def _js(obj) -> str:
    """JSON safe inside a <script> element."""
    return json.dumps(obj, ensure_ascii=False, default=str).replace("</", "<\\/")


_TEMPLATE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
 body{font:13px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:0;color:#1d1d1f;background:#fafafa}
 header{padding:10px 16px;background:#fff;border-bottom:1px solid #ddd;position:sticky;top:0;z-index:2}
 header h1{font-size:15px;margin:0 0 4px} .mark{color:#b00020;font-weight:bold}
 .filters select,.filters input{margin-right:8px;font-size:12px}
 main{display:flex;gap:0} #list{width:430px;min-width:330px;border-right:1px solid #ddd;height:calc(100vh - 86px);overflow:auto;background:#fff}
 #list table{border-collapse:collapse;width:100%} #list td,#list th{padding:3px 6px;border-bottom:1px solid #eee;text-align:left;font-size:12px}
 #list tr.sample-row{cursor:pointer} #list tr.sample-row:hover{background:#eef4ff} #list tr.sel{background:#dce8ff}
 #detail{flex:1;padding:12px 18px;height:calc(100vh - 86px);overflow:auto}
 .st-ok{color:#1a7f37}.st-no_answer{color:#9a6700}.st-error,.st-timeout{color:#b00020}
 .g-CORRECT{color:#1a7f37;font-weight:600}.g-INCORRECT{color:#b00020}.g-NOT_ATTEMPTED{color:#9a6700}
 details{margin:4px 0} summary{cursor:pointer}
 .span{border-left:3px solid #8aa8d8;margin:6px 0 6px 4px;padding-left:10px}
 .span.init{border-color:#c9a0dc}.span.branch{border-color:#f0a35e}
 .span-title{font-weight:600;color:#555}
 .call{background:#fff;border:1px solid #ddd;border-radius:6px;padding:4px 8px;margin:6px 0}
 .call.rejected{border-color:#e7a1a1} .call > summary{font-weight:500}
 .badge{display:inline-block;padding:0 5px;border-radius:8px;background:#eee;margin-left:4px;font-size:11px}
 .msg{border-top:1px dashed #ddd;padding:4px 0} .role{font-weight:600;font-size:11px;color:#666;text-transform:uppercase}
 pre{white-space:pre-wrap;word-break:break-word;margin:2px 0;font:12px/1.4 ui-monospace,Menlo,monospace}
 img.thumb{max-width:150px;max-height:120px;border:1px solid #ccc;margin:2px 4px 2px 0;vertical-align:top}
 .tool{background:#f6f8fa;border-radius:4px;padding:2px 6px;margin:4px 0}
 .tok{border-radius:2px} #legend{display:inline-block;vertical-align:middle}
 #legend .bar{display:inline-block;width:160px;height:10px;vertical-align:middle;border:1px solid #bbb}
 .err{color:#b00020}
 table.summary th{text-align:left;padding:2px 12px 2px 0;color:#555;font-weight:600;vertical-align:top} table.summary td{padding:2px 0}
 table.removal-table{border-collapse:collapse;margin:6px 0} table.removal-table td,table.removal-table th{border:1px solid #ddd;padding:2px 6px;font-size:12px}
 .gr-Image-Needed{background:#cfe2ff}.gr-Image-Derived{background:#ffe5c2}.gr-Text-Only{background:#d3f0dc}
</style></head><body>
<header>
 <h1 id="title"></h1>
 <div class="filters">
  status <select id="f-status"><option value="">all</option></select>
  grade <select id="f-grade"><option value="">all</option></select>
  benchmark <select id="f-bench"><option value="">all</option></select>
  id <input id="f-id" size="14" placeholder="filter">
  colour think tokens by <select id="colour"><option value="H">entropy H (nats)</option></select>
  <span id="legend"></span>
  <span id="pages"></span>
 </div>
</header>
<main><div id="list"><table><thead><tr><th>sample</th><th>t</th><th>status</th><th>calls</th><th>grade</th><th>answer / gold</th></tr></thead><tbody id="rows"></tbody></table></div>
<div id="detail"></div></main>
<script type="application/json" id="meta">__META__</script>
<script type="application/json" id="samples">__SAMPLES__</script>
<script type="application/json" id="details">__DETAILS__</script>
<script type="application/json" id="images">__IMAGES__</script>
<script>
"use strict";
const J = id => JSON.parse(document.getElementById(id).textContent);
const META = J("meta"), SAMPLES = J("samples"), DETAILS = J("details"), IMAGES = J("images");
const cache = {};
const esc = s => String(s ?? "").replace(/[&<>"]/g, c => ({"&":"&amp;","<":"&lt;",">":"&gt;",'"':"&quot;"}[c]));
document.getElementById("title").innerHTML = esc(META.label) + " &middot; " + esc(META.model || "") + " &middot; " +
  esc(META.benchmark) + " &middot; " + META.shown + " of " + META.n_lines + " trajectories" +
  (META.judge ? " &middot; judge: " + esc(META.judge) : " &middot; not judged") +
  (META.probe_mode ? " &middot; entropy probe: " + esc(META.probe_mode) : "") +
  (META.mark ? ' &middot; <span class="mark">' + esc(META.mark) + "</span>" : "");
if (META.has_token_probe) {
  const c = document.getElementById("colour");
  c.insertAdjacentHTML("beforeend", '<option value="dH">ΔH with − without images (nats)</option><option value="kl">KL(with ‖ without) influence (nats)</option>');
}
function fillSelect(id, key) {
  const s = document.getElementById(id);
  [...new Set(SAMPLES.map(r => r[key]).filter(x => x !== ""))].sort().forEach(v => s.insertAdjacentHTML("beforeend", `<option>${esc(v)}</option>`));
  s.onchange = renderList;
}
fillSelect("f-status", "status"); fillSelect("f-grade", "grade"); fillSelect("f-bench", "benchmark");
document.getElementById("f-id").oninput = renderList;
document.getElementById("colour").onchange = () => { legend(); if (current) show(current); };
let current = null;
function renderList() {
  const fs = document.getElementById("f-status").value, fg = document.getElementById("f-grade").value,
        fb = document.getElementById("f-bench").value, fi = document.getElementById("f-id").value.toLowerCase();
  const rows = SAMPLES.filter(r => (!fs || r.status === fs) && (!fg || r.grade === fg) && (!fb || r.benchmark === fb) &&
                                   (!fi || r.id.toLowerCase().includes(fi)));
  document.getElementById("rows").innerHTML = rows.map(r =>
    `<tr class="sample-row" data-key="${esc(r.key)}"><td>${esc(r.id)}</td><td>${r.trial}</td>` +
    `<td class="st-${esc(r.status)}">${esc(r.status)}</td><td>${r.calls}</td><td class="g-${esc(r.grade)}">${esc(r.grade)}</td>` +
    `<td>${esc(r.answer)}<br><small>gold: ${esc(r.gold)}</small>` +
    (r.page !== META.this_file ? ` <small class="other-page" title="opens ${esc(r.page)}">↗ ${esc(r.page)}</small>` : "") + `</td></tr>`).join("");
  document.querySelectorAll("tr.sample-row").forEach(tr => tr.onclick = () => open_(tr.dataset.key));
}
// a trajectory written on another page of this run opens there (each page holds its own trajectories' details)
function open_(key) {
  const s = SAMPLES.find(r => r.key === key);
  if (s && s.page && s.page !== META.this_file) { location.href = encodeURI(s.page) + "#sample=" + encodeURIComponent(key); return; }
  show(key);
}
async function detail(key) {
  if (!cache[key]) {
    const bytes = Uint8Array.from(atob(DETAILS[key]), c => c.charCodeAt(0));
    const text = await new Response(new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"))).text();
    cache[key] = JSON.parse(text);
  }
  return cache[key];
}
const SCALE = {H: [0, 3], dH: [-1, 1], kl: [0, 1]};
function colour(v, mode) {
  if (v === null || v === undefined) return "transparent";
  const [lo, hi] = SCALE[mode];
  let t = Math.max(0, Math.min(1, (v - lo) / (hi - lo)));
  if (mode === "dH") { const a = Math.abs(t - 0.5) * 2; return t > 0.5 ? `rgba(214,39,40,${a * 0.75})` : `rgba(31,119,180,${a * 0.75})`; }
  return `rgba(255,${Math.round(230 - 170 * t)},${Math.round(120 - 110 * t)},${0.15 + 0.75 * t})`;
}
function legend() {
  const mode = document.getElementById("colour").value, [lo, hi] = SCALE[mode];
  const stops = [0, 0.25, 0.5, 0.75, 1].map(t => colour(lo + t * (hi - lo), mode)).join(",");
  document.getElementById("legend").innerHTML = `${lo} <span class="bar" style="background:linear-gradient(90deg,${stops})"></span> ${hi}` +
    (mode === "dH" ? " (blue: the images lower it; red: raise it)" : "");
}
legend();
// think tokens are columns: text, H in centinats, dH in centinats, kl in millinats (see _call_tokens)
const UNIT = {H: 100, Hhi: 100, dH: 100, kl: 1000};
function tokensHtml(col) {
  if (!col || !col.text.length) return "";
  const mode = document.getElementById("colour").value, vals = col[mode];
  const num = (c, i, k) => (c[k] && c[k][i] !== null && c[k][i] !== undefined) ? c[k][i] / UNIT[k] : null;
  return col.text.map((t, i) => {
    const h = num(col, i, "H"), d = num(col, i, "dH"), k = num(col, i, "kl");
    const v = vals ? num(col, i, mode) : null;
    const hi = num(col, i, "Hhi"), alt = col.alt ? col.alt[i] : null;
    const fmt = side => side.map(([s, pm]) => `${JSON.stringify(s)} ${(pm / 10).toFixed(1)}%`).join(" · ");
    const tip = `H=${h.toFixed(2)}${d !== null ? " ΔH=" + d.toFixed(2) : ""}${k !== null ? " KL=" + k.toFixed(3) : ""}` +
      (hi !== null ? `\nexact H in [${h.toFixed(2)}, ${hi.toFixed(2)}] (top-20 + vocabulary)` : "") +
      (alt ? `\nwith images: ${fmt(alt[0])}\nwithout: ${fmt(alt[1])}` : "");
    return `<span class="tok" title="${esc(tip)}" style="background:${colour(v, mode)}">${esc(t)}</span>`;
  }).join("");
}
function partsHtml(parts) {
  return parts.map(p => p.img !== undefined ? (p.img && IMAGES[p.img] ? `<img class="thumb" alt="image ${esc(p.img.slice(0, 12))}" title="sha256 ${esc(p.img)}" src="${IMAGES[p.img]}">` :
                                           `<span class="err">[image ${esc(p.img || p.url)} not stored]</span>`)
                                        : `<pre>${esc(p.text)}</pre>`).join("");
}
function callHtml(d, ev, tools, probe) {
  const u = ev.usage || {}, act = ev.action || {}, toks = d.tokens[ev.index], g = (d.grounding || {})[ev.index];
  const nT = toks ? toks.H.length : 0, meanH = nT ? toks.H.reduce((a, x) => a + x, 0) / nT / UNIT.H : 0;
  let what = ev.action_error ? `<span class="err">rejected</span>` : esc(act.kind || "") + (act.name ? " " + esc(act.name) : "");
  const badges = `<span class="badge">${ev.n_images} img (${ev.n_query_images || 0} query)</span>` +
    `<span class="badge">${u.prompt_tokens} prompt tok</span><span class="badge">${ev.n_tokens} out (${ev.think_tokens} think)</span>` +
    (nT ? `<span class="badge">H̄ ${meanH.toFixed(2)}</span>` : "") +
    (ev.dH !== null && ev.dH !== undefined ? `<span class="badge" style="background:${colour(ev.dH, "dH")}">ΔH ${(+ev.dH).toFixed(3)}</span>` : "") +
    (g ? `<span class="badge gr-${esc(g.category.replace(/ /g, "-"))}" title="grounding annotator: ${esc(g.reasons.join(" | "))}">${esc(g.category)}</span>` : "") +
    (ev.correction ? '<span class="badge">correction</span>' : "") + (ev.forced ? '<span class="badge">forced</span>' : "") +
    (probe ? `<span class="badge" title="adaptive image release: influence of the query images on this step (${esc(probe.signal)}), ε=${probe.threshold}">influence ${probe.influence === null ? "n/a" : (+probe.influence).toFixed(3)}${probe.decision === "release" ? " → release" : ""}</span>` : "");
  let body = `<details class="messages"><summary>messages sent (${ev.message_ids.length})</summary>` +
    ev.message_ids.map(i => { const m = d.messages[i]; return `<div class="msg"><span class="role">${esc(m.role)}</span>` +
      (m.reasoning ? `<details><summary>reasoning in history</summary><pre>${esc(m.reasoning)}</pre></details>` : "") + partsHtml(m.parts) + "</div>"; }).join("") +
    `</details>`;
  body += `<details class="reasoning"><summary>reasoning (${ev.think_tokens} think tokens${nT ? ", coloured" : META.tokens ? "" : "; not coloured: this page was written without tokens (agent.show --tokens all)"})</summary>` +
    `<div>${tokensHtml(toks) || `<pre>${esc(ev.reasoning || "")}</pre>`}</div></details>`;
  body += `<div><b>text:</b><pre>${esc(ev.text)}</pre></div>`;
  if (ev.action_error) body += `<div class="err">rejected: ${esc(ev.action_error)}</div>`;
  if (g) body += `<div class="tool grounding">grounding (annotator): <b>${esc(g.category)}</b>${g.reasons.length ? " — " + g.reasons.map(esc).join(" | ") : ""}</div>`;
  const rm = (d.removal || []).find(r => r.k === ev.index);
  if (rm) body += `<div class="tool removal">images removed from this step on (k=${rm.k}): ${rm.correct === null ? `<span class="err">replay failed: ${esc(rm.error || rm.status)}</span>` : rm.correct ? '<span class="g-CORRECT">correct</span>' : '<span class="g-INCORRECT">wrong</span>'}${rm.replayed ? "" : " (not replayed: no query image from here on)"}</div>`;
  if (probe) body += `<div class="tool">release probe (${esc(probe.signal)}): influence ${probe.influence === null ? "n/a" : (+probe.influence).toFixed(4)} ` +
    `(KL ${probe.kl === null ? "n/a" : (+probe.kl).toFixed(4)}, ΔH ${probe.dH === null ? "n/a" : (+probe.dH).toFixed(4)}) ${probe.below ? "&lt;" : "≥"} ε=${(+probe.threshold).toPrecision(4)}; streak ${probe.streak}` +
    (probe.decision === "release" ? ` → <b>images removed from step ${probe.release_step} on</b>` : " → keep") + `; ${probe.scoring_calls} scoring call(s), ${probe.latency_s} s</div>`;
  if (act.fold) body += `<div>fold ${esc(JSON.stringify(act.fold))}</div>`;
  for (const t of tools) {
    body += `<details class="tool"><summary>${esc(t.name)}(${esc(JSON.stringify(t.args))}) ${t.ok ? "ok" : '<span class="err">failed</span>'}${t.cache_hit ? " · cached" : ""}${(t.result_images || []).length ? " · " + t.result_images.length + " result images" : ""}</summary>` +
      `${(t.result_images || []).map(h => IMAGES[h] ? `<img class="thumb" src="${IMAGES[h]}" title="sha256 ${esc(h)}">` : "").join("")}<pre>${esc(t.observation)}</pre></details>`;
  }
  return `<details class="call${ev.action_error ? " rejected" : ""}" data-index="${ev.index}"><summary>#${ev.index}/${META.t_max} ${esc(ev.state)}${ev.branch ? " " + esc(ev.branch) : ""} · ${what} ${badges}</summary>${body}</details>`;
}
async function show(key) {
  current = key;
  document.querySelectorAll("tr.sample-row").forEach(tr => tr.classList.toggle("sel", tr.dataset.key === key));
  const d = await detail(key), s = SAMPLES.find(r => r.key === key);
  const tools = {}; d.events.filter(e => e.type === "tool_call").forEach(e => (tools[e.call_index] = tools[e.call_index] || []).push(e));
  const probes = {}; d.events.filter(e => e.type === "release_probe").forEach(e => (probes[e.call_index] = e));
  let h = `<h2>${esc(s.id)} · trial ${s.trial} · <span class="st-${esc(d.status)}">${esc(d.status)}</span>${s.grade ? ` · <span class="g-${esc(s.grade)}">${esc(s.grade)}</span>` : ""}</h2>` +
    `<p><b>question:</b> ${esc(d.question)}<br><b>gold:</b> ${esc(d.gold)} · <b>answer:</b> ${esc(d.answer || "—")}` +
    (d.error ? `<br><span class="err">error: ${esc(d.error)}</span>` : "") + `</p><div class="query">` +
    Object.entries(d.query_images || {}).map(([k, v]) => IMAGES[v] ? `<figure style="display:inline-block;margin:0 8px"><img class="thumb" src="${IMAGES[v]}"><figcaption>${esc(k)}</figcaption></figure>` : "").join("") + `</div>`;
  if ((d.removal || []).length) h += `<table class="removal-table"><tr><th>step-k removal</th>` + d.removal.map(r => `<th>k=${r.k}</th>`).join("") +
    `</tr><tr><td>replay (original: ${d.removal[0].original ? "correct" : "wrong"})</td>` + d.removal.map(r => `<td>${r.correct === null ? '<span class="err">failed</span>' : r.correct ? '<span class="g-CORRECT">correct</span>' : '<span class="g-INCORRECT">wrong</span>'}</td>`).join("") + `</tr></table>`;
  const stack = [{html: "", cls: null}];
  const push = (cls, title) => stack.push({html: `<div class="span-title">${title}</div>`, cls});
  const pop = footer => { const top = stack.pop(); stack[stack.length - 1].html += `<div class="span ${top.cls}">${top.html}${footer || ""}</div>`; };
  for (const ev of d.events) {
    if (ev.type === "llm_call" && ev.parent === "init" && stack[stack.length - 1].cls !== "init") push("init", "initialization");
    if (ev.type === "llm_call" && ev.parent !== "init" && stack[stack.length - 1].cls === "init") pop();
    if (ev.type === "llm_call") stack[stack.length - 1].html += callHtml(d, ev, tools[ev.index] || [], probes[ev.index]);
    else if (ev.type === "branch_begin") push("branch", `branch ${esc(ev.branch)}: ${esc(ev.description)} · assigned ${esc(JSON.stringify(ev.assigned_images))}`);
    else if (ev.type === "branch_end") pop(`<div>↩ folded back (${esc(ev.reason)}): <pre>${esc(ev.message)}</pre></div>`);
    else if (ev.type === "init_end") { if (stack[stack.length - 1].cls === "init") pop(); stack[stack.length - 1].html += `<details><summary>image context folded into MAIN</summary><pre>${esc(JSON.stringify(ev.descriptions, null, 1))}</pre></details>`; }
    else if (ev.type === "final_answer") stack[stack.length - 1].html += `<p><b>answer${ev.forced ? " (forced)" : ""}:</b> ${esc(ev.answer)}</p>`;
    else if (ev.type === "error") stack[stack.length - 1].html += `<p class="err">error ${esc(ev.kind)}: ${esc(ev.message)}</p>`;
  }
  while (stack.length > 1) pop();
  document.getElementById("detail").innerHTML = h + stack[0].html;
}
function landing() {  // the run at a glance, until a sample is picked
  const S = META.summary, row = (k, v) => `<tr><th>${esc(k)}</th><td>${v}</td></tr>`;
  const st = Object.entries(S.statuses).map(([k, v]) => `<span class="st-${esc(k)}">${esc(k)} ${v}</span>`).join(" · ");
  const jd = Object.entries(S.judges).map(([k, v]) => row("accuracy (" + k + ")", v.accuracy === null ? "—" :
    `<b>${v.accuracy.toFixed(1)} %</b> (${v.correct} of ${v.graded} graded)`)).join("") || row("accuracy", "not judged (python -m agent.judge " + esc(META.run) + ")");
  const pr = Object.entries(S.probes).map(([k, v]) => `${esc(k)}: ${esc(v)}`).join("<br>") || "none ran";
  document.getElementById("detail").innerHTML = `<div id="landing"><h2>${esc(S.method)} · ${esc(META.model || "")} · ${esc(META.benchmark)}</h2>` +
    (META.mark ? `<p class="mark">${esc(META.mark)}</p>` : "") + `<table class="summary">` +
    row("trajectories", `${S.trajectories} (${S.trials} trial(s)); statuses: ${st}`) + jd +
    row("LLM calls", `${S.llm_calls} (${S.mean_calls} per trajectory); ${S.tool_calls} tool calls`) +
    row("tokens", `${S.prompt_tokens.toLocaleString()} prompt · ${S.completion_tokens.toLocaleString()} completion`) +
    row("probes", pr) + `</table><p>Pick a trajectory on the left.</p></div>`;
}
if (META.pages.length > 1) document.getElementById("pages").innerHTML = "page " + META.pages.map((p, i) =>
  i + 1 === META.page ? `<b>${i + 1}</b>` : `<a href="${encodeURI(p.file)}" title="${esc(p.first)} … ${esc(p.last)} (${p.n})">${i + 1}</a>`).join(" ") +
  ` of ${META.pages.length} (${SAMPLES.length} trajectories; ${META.pages[META.page - 1].n} on this one)`;
landing();
renderList();
// deep links for sharing and tests: #sample=<id>__t<trial>&open=<call index>&show=messages,reasoning,tool&colour=H|dH|kl
// open the sample and the call as clicks would (show: which parts of the call to expand; default messages)
(async () => {
  const p = new URLSearchParams(location.hash.slice(1));
  const col = document.getElementById("colour");
  if (p.get("colour") && [...col.options].some(o => o.value === p.get("colour"))) { col.value = p.get("colour"); legend(); }
  if (p.get("sample")) {
    document.querySelector(`tr.sample-row[data-key="${CSS.escape(p.get("sample"))}"]`)?.click();
    await detail(p.get("sample")); await new Promise(r => setTimeout(r, 50));
    const c = document.querySelector(`details.call[data-index="${CSS.escape(p.get("open") || "1")}"]`);
    if (c) {
      c.querySelector("summary").click();
      for (const part of (p.get("show") || "messages").split(","))
        c.querySelectorAll(`:scope > details.${CSS.escape(part)} > summary`).forEach(s => s.click());
      c.scrollIntoView();
    }
  }
  document.body.dataset.readyMs = Math.round(performance.now());  // time to a usable page (measured in the README)
  document.body.dataset.ready = "1";
})();
</script></body></html>
"""


def main(argv=None) -> int:

    ap = make_parser("python -m agent.show", __doc__, [
        "python -m agent.show runs/demo-react",
        "python -m agent.show runs/demo-react demo_3 --reasoning",
        "python -m agent.show runs/demo-react --html runs/demo-react/run.html"])
    ap.add_argument("run_dir", help="a run directory")
    ap.add_argument("sample_id", nargs="?", help="one trajectory (none: the list of samples)")
    ap.add_argument("--trial", type=int, default=0, help="which trial of the sample")
    ap.add_argument("--reasoning", action="store_true", help="show each call's whole reasoning (default: its first line)")
    ap.add_argument("--observation-chars", type=int, default=400, help="observations are cut at this length")
    ap.add_argument("--html", metavar="OUT.html", help="write the whole run as self-contained HTML (one page per "
                                                        "--page-size trajectories: OUT.html, OUT-p2.html, …)")
    ap.add_argument("--page-size", type=int, default=PAGE_SIZE,
                    help=f"HTML: trajectories per page (default {PAGE_SIZE}; each page lists every trajectory)")
    ap.add_argument("--limit", type=int, help="HTML: the first N trajectories only")
    ap.add_argument("--tokens", choices=("auto", "all", "none"), default="auto",
                    help=f"HTML: embed each call's think tokens, coloured by H / ΔH / KL (auto: when at most "
                         f"{AUTO_TOKENS} trajectories are written; they dominate the page's size)")
    a = ap.parse_args(argv)
    try:
        run = load_run(a.run_dir)
        if a.html:
            info = build_html(run.path, a.html, limit=a.limit, sample_ids=[a.sample_id] if a.sample_id else None,
                              tokens=a.tokens, page_size=a.page_size)
            pages = len(info["pages"])
            print(f"{info['samples']} trajectories, {info['images']} images, {info['bytes'] / 1e6:.1f} MB"
                  + (f" in {pages} pages (largest {info['largest_page_bytes'] / 1e6:.1f} MB)" if pages > 1 else "")
                  + ("" if info["tokens"] else "; think tokens not embedded (--tokens all, or fewer trajectories "
                     "with --limit / a SAMPLE_ID, colours them)"))
            if info["missing_images"]:
                print(f"warning: {len(info['missing_images'])} images are not stored in {run.path}/images", file=sys.stderr)
            done([info["path"]], f"open it in a browser (file://{Path(info['path']).resolve()})")
            return 0
        if not a.sample_id:
            df = sample_table(run)
            if df.empty:
                print(f"{run.path}: no finished trajectory yet")
                return 0

            with pd.option_context("display.max_rows", 500, "display.max_colwidth", 40, "display.width", 160):
                print(df.to_string(index=False))
            print(f"\n{len(df)} trajectories; judge: {df.attrs.get('judge') or 'none yet'}")
            done([], f"python -m agent.show {a.run_dir} {df.iloc[0]['sample_id']}   |   "
                     f"python -m agent.show {a.run_dir} --html {a.run_dir}/run.html")
            return 0
        line = next((ln for ln in run.index if ln["sample_id"] == a.sample_id and int(ln["trial"]) == a.trial), None)
        if line is None:
            print(f"error: {run.path}: no trajectory {a.sample_id} trial {a.trial}", file=sys.stderr)
            return 2
        print(render_text(run, run.full(line), reasoning=a.reasoning, observation_chars=a.observation_chars))
        return 0
    except RunError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # `python -m agent.show RUN | head`: the reader left; not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
