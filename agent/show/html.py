"""The whole run as self-contained HTML pages: the sample list and, per sample, its timeline, messages, images
and coloured think tokens (the page itself: ``page.html`` beside this file)."""
from __future__ import annotations

import base64
import gzip
import html
import io
import json
import re
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from analysis.entropy import entropy_bounds, grouped_tail_entropy
from analysis.figures import provenance_mark
from probes.entropy import read_step_tokens

from ..backends.base import model_vocab_size
from ..backends.scripted import ScriptedBackend
from ..backends.tiny_model import default_tiny_dir
from ..http import redact
from ..rundir import Run, RunError, load_run, token_key

__all__ = ["build_html", "page_files", "PAGE_SIZE", "AUTO_TOKENS", "EMBED_PX", "PAGE_TEMPLATE"]


# ---------------------------------------------------------------------------- HTML
#: Images larger than this (pixels on the longer side) are embedded downscaled (JPEG, quality 85; ours): a 322 KB
#: photo is ~430 KB of base64 in the page, its 768-pixel copy ~60 KB; the originals stay in RUN/images/.
EMBED_PX = 768
from .data import _grades, _grounding_labels, _probe_steps, _removal_outcomes, run_summary, short

#: The page's HTML, style and script; ``__TITLE__`` and the data placeholders are filled per page.
PAGE_TEMPLATE = (Path(__file__).parent / "page.html").read_text(encoding="utf-8")


def _image_uri(run: Run, sha: str, cache: dict, missing: list, max_px: int | None = None) -> str | None:
    if sha in cache:
        return cache[sha]
    try:
        p = run.image_path(sha)
    except RunError as e:  # a stored image that leads out of the run directory: never read, never embedded
        print(f"warning: {e}", file=sys.stderr)
        p = None
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
#: bounded at any run size.
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
                            "answer": short(ln.get("answer"), 80), "gold": short(ln.get("gold"), 80),
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
        fill = {"__TITLE__": html.escape(f"{h.get('label')} — {run.path.name}"
                                         + (f" (page {i + 1} of {len(files)})" if len(files) > 1 else "")),
                "__META__": _js({**meta, "page": i + 1, "this_file": f.name}), "__SAMPLES__": samples_js,
                "__DETAILS__": _js(details), "__IMAGES__": _js({k: v for k, v in images.items() if v})}
        # one pass: a placeholder's name inside the data (a label, an answer) is never filled in again
        page = _PLACEHOLDER.sub(lambda m: fill[m.group(0)], PAGE_TEMPLATE)
        f.write_text(redact(page), encoding="utf-8")
        total += f.stat().st_size
        n_images += sum(1 for v in images.values() if v)
        del details, images, page
    for stale in out_path.parent.glob(f"{out_path.stem}-p*{out_path.suffix}"):  # pages of an earlier, larger write
        if stale not in files and stale.stem[len(out_path.stem) + 2:].isdigit():
            stale.unlink()
    return {"path": str(out_path), "bytes": total, "samples": len(samples), "images": n_images,
            "missing_images": sorted(set(missing)), "tokens": with_tokens, "pages": [str(f) for f in files],
            "largest_page_bytes": max(f.stat().st_size for f in files)}


_PLACEHOLDER = re.compile(r"__(?:TITLE|META|SAMPLES|DETAILS|IMAGES)__")


def _js(obj) -> str:
    """JSON safe inside a <script> element: no ``<``, ``>`` or ``&`` left as such (an answer holding ``<!--<script>``
    or ``</script>`` would otherwise change how the HTML parser reads the rest of the page)."""
    return (json.dumps(obj, ensure_ascii=False, default=str)
            .replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))
