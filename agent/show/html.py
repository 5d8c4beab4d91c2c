"""The whole run as self-contained HTML pages: the sample list and, per sample, its timeline, messages, images
and coloured think tokens (the page itself: ``page.html`` beside this file)."""
from __future__ import annotations

import base64
import gzip
import html
import io
import json
import logging
import re
from pathlib import Path

import numpy as np
from PIL import Image

from analysis.estimators.entropy import entropy_bounds, grouped_tail_entropy
from analysis.figures import provenance_mark
from probes.entropy import read_step_tokens

from ..choices import AUTO_TOKENS
from ..paths import read_regular
from ..record import LineSummary, LlmCall, ResultLine
from ..record.line import ImagePart
from ..rundir import Run, RunError, load_run, token_key

__all__ = ["build_html", "files_dir", "LIST_CHUNK", "INDEX_ROWS", "AUTO_TOKENS", "EMBED_PX", "PAGE_TEMPLATE"]


# ---------------------------------------------------------------------------- HTML
#: Images larger than this (pixels on the longer side) are embedded downscaled (JPEG, quality 85; ours): a 322 KB
#: photo is ~430 KB of base64 in the page, its 768-pixel copy ~60 KB; the originals stay in RUN/images/.
EMBED_PX = 768
from .data import VIEW_FIELDS, grades_of_run, grounding_labels, probe_steps, removal_outcomes, run_summary, short

log = logging.getLogger(__name__)

#: The page's HTML, style and script; ``__TITLE__`` and the data placeholders are filled per page.
PAGE_TEMPLATE = (Path(__file__).parent / "page.html").read_text(encoding="utf-8")


def _image_uri(run: Run, sha: str, cache: dict, missing: list, max_px: int | None = None) -> str | None:
    if sha in cache:
        return cache[sha]
    try:
        p = run.image_path(sha)
        data = None if p is None else read_regular(p)
    except (RunError, OSError) as e:  # leads out of the run directory, or a FIFO: never read, never embedded
        log.warning(f"warning: {e}")
        data = None
    if data is None or p is None:
        missing.append(sha)
        cache[sha] = None
        return None
    ext = p.suffix.lstrip(".").replace("jpg", "jpeg")
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


def _call_tokens(run: Run, line: ResultLine, tf_dir: Path | None, warnings: list) -> dict:
    """Per call, its think tokens as columns: text, H (centinats), and where the teacher-forced probe ran on
    this run ΔH (centinats) and KL (millinats). Integers compress well; the colour scale needs no more. What cannot
    be shown (a damaged sidecar, a per-token probe file not as sealed) is said in ``warnings``, never hidden."""

    if not line.tokens_file:
        return {}
    try:
        try:  # an adaptive-unloading run carries its online per-token KL / ΔH (agent/methods/unload.py)
            tok = run.tokens(line, ["call", "text", "think", "top_logprobs", "unload_kl", "unload_dH"])
        except RunError as e:
            if "no column" not in str(e) and "unload_" not in str(e):
                raise
            tok = run.tokens(line, ["call", "text", "think", "top_logprobs"])
    except RunError as e:
        warnings.append(f"no tokens shown: {e}")
        log.warning(f"warning: {line.sample_id}#{line.trial}: no tokens shown: {e}")
        return {}
    if "text" not in tok:  # a record from before token texts were kept
        return {}
    H = grouped_tail_entropy(tok["top_logprobs"])
    vocab = _run_vocab(run)
    H_hi = None
    if vocab:  # the upper bound of each token's exact entropy (analysis.estimators.entropy.entropy_bounds), for the hover

        H_hi = entropy_bounds(tok["top_logprobs"], vocab)[1]
    out = {}
    probed = {}
    if tf_dir is not None:  # the teacher-forced probe's per-token ΔH / KL of this trajectory (one file), as sealed
        try:
            probed = read_step_tokens(tf_dir, token_key(line.sample_id, line.trial))
        except RunError as e:
            warnings.append(f"no per-token ΔH / KL shown: {e}")
            log.warning(f"warning: {line.sample_id}#{line.trial}: no per-token ΔH / KL shown: {e}")
    for c in np.unique(tok["call"]):
        idx = np.flatnonzero(tok["call"] == c)
        think = tok["think"][idx].astype(bool)
        col = {"text": ["" if t is None else str(t) for t in tok["text"][idx][think]],
               "H": np.rint(H[idx][think] * 100).astype(int).tolist()}
        if H_hi is not None:
            col["Hhi"] = np.rint(H_hi[idx][think] * 100).astype(int).tolist()
        t = probed.get(int(c))
        if t is None and "unload_kl" in tok and np.isfinite(tok["unload_kl"][idx]).any():
            col["dH"] = [None if not np.isfinite(v) else int(round(v * 100)) for v in tok["unload_dH"][idx][think]]
            col["kl"] = [None if not np.isfinite(v) else int(round(v * 1000)) for v in tok["unload_kl"][idx][think]]
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
    """The run's model vocabulary size (for the entropy upper bound), as its header records it; None when it does
    not (the hover then shows no upper bound): the viewer reads the record, never a model's files."""
    return run.header.backend.vocab_size


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


def _sample_detail(run: Run, line: ResultLine, images: dict, missing: list, dH: dict, tf_dir: Path | None,
                   with_tokens: bool = True, grounding: dict | None = None, removal: dict | None = None) -> dict:
    msgs = []
    for m in line.messages:
        parts = []
        if isinstance(m.content, list):
            for p in m.content:
                if isinstance(p, ImagePart):
                    if p.sha256:
                        _image_uri(run, p.sha256, images, missing)
                    parts.append({"img": p.sha256, "url": p.url})
                else:
                    parts.append({"text": p.text})
        else:
            parts.append({"text": m.content or ""})
        msgs.append({"role": m.role, "parts": parts, "reasoning": m.reasoning_content})
    for h in line.query_images.values():
        _image_uri(run, h, images, missing)
    events = []
    for ev in line.events:  # as recorded (the page's script reads the record's field names)
        e = ev.model_dump(mode="json", exclude_unset=True, exclude={"sampling"})
        if isinstance(ev, LlmCall):
            e["dH"] = dH.get((line.sample_id, line.trial, ev.index))
        events.append(e)
    warnings: list = []
    return {"events": events, "messages": msgs, "tokens": _call_tokens(run, line, tf_dir, warnings) if with_tokens else {},
            "warnings": warnings, "question": line.question, "gold": line.gold, "answer": line.answer,
            "query_images": line.query_images, "error": line.error, "status": line.status,
            "grounding": (grounding or {}).get(line.key) or {}, "removal": (removal or {}).get(line.key) or []}


#: Rows per file of the index's trajectory list (``list-<i>.js``, loaded by the index page as it pages or
#: searches): every file the viewer writes has a size independent of the number of trajectories.
LIST_CHUNK = 500
#: Trajectories per page of the index's list.
INDEX_ROWS = 100


def files_dir(out_path: Path) -> Path:
    """The folder beside the index page holding one page per trajectory and the list's chunks."""
    return out_path.with_name(f"{out_path.stem}_files")


def _row(ln: LineSummary, grades: dict) -> dict:
    return {"key": f"{ln.sample_id}__t{ln.trial}", "file": token_key(ln.sample_id, ln.trial) + ".html",
            "id": ln.sample_id, "trial": ln.trial, "status": ln.status, "benchmark": ln.benchmark,
            "category": ln.paper_category, "grade": grades.get(ln.key, ""), "calls": ln.n_calls,
            "answer": short(ln.answer, 80), "gold": short(ln.gold, 80)}


def _page(fill: dict) -> str:
    # one pass: a placeholder's name inside the data (a label, an answer) is never filled in again
    return _PLACEHOLDER.sub(lambda m: fill[m.group(0)], PAGE_TEMPLATE)


def build_html(run_dir, out_path, *, limit: int | None = None, sample_ids: list[str] | None = None,
               tokens: str = "auto") -> dict:
    """Write the viewer: ``OUT.html``, the index (the run at a glance, and the trajectories in pages of 100 with
    filters and search over all of them), and ``OUT_files/``: one self-contained page per trajectory (its
    messages, events, images and tokens; links back to the index and to its neighbours) and the index's list in
    files of :data:`LIST_CHUNK` rows. No page lists every trajectory, so each page's size and the writer's
    memory (one trajectory at a time) do not grow with the run. Returns sizes for the caller to report.
    ``tokens``: ``all`` embeds every call's think tokens (coloured by H / ΔH / KL), ``none`` none, ``auto``
    all when at most :data:`AUTO_TOKENS` trajectories are written, else none (the page says so)."""
    if tokens not in ("auto", "all", "none"):
        raise ValueError(f"tokens must be auto, all or none, not {tokens!r}")
    run = load_run(run_dir, fields=VIEW_FIELDS)  # a few hundred bytes a trajectory; each line read for its page
    grades, judge = grades_of_run(run)
    dH, mode = probe_steps(run)
    tokens_dir = run.path / "probes" / "entropy-teacher-forced" / "tokens"
    tf_dir = tokens_dir if tokens_dir.is_dir() else None
    has_release = bool((run.header.image_unload or {}).get("policy"))
    lines = sorted(run.index, key=lambda ln: ln.key)  # summaries; whole lines one at a time
    if sample_ids:
        lines = [ln for ln in lines if ln.sample_id in set(sample_ids)]
    lines = lines[: limit or None]
    with_tokens = tokens == "all" or (tokens == "auto" and len(lines) <= AUTO_TOKENS)
    grounding, removal = grounding_labels(run), removal_outcomes(run)
    out_path = Path(out_path)
    fdir = files_dir(out_path)
    fdir.mkdir(parents=True, exist_ok=True)
    h = run.header
    options = {"status": sorted({ln.status for ln in lines} - {""}), "benchmark": sorted({ln.benchmark for ln in lines} - {""})}
    options["grade"] = sorted({g for g in grades.values() if g})
    meta = {"run": str(run.path), "label": h.label, "model": h.model.served_model if h.model else None,
            "t_max": h.budgets.t_max, "judge": judge, "probe_mode": mode,
            "has_token_probe": tf_dir is not None or has_release, "mark": provenance_mark([h]), "benchmark": h.benchmark,
            "n_lines": len(run.index), "shown": len(lines), "tokens": with_tokens, "options": options,
            "index": out_path.name, "files": fdir.name, "chunks": -(-len(lines) // LIST_CHUNK), "per_page": INDEX_ROWS}
    title = html.escape(f"{h.label} — {run.path.name}")
    # the list's rows (a few hundred bytes each) are made before the pages, and only counters outlive a
    # trajectory: small objects kept across a trajectory's churn would pin the allocator's arenas, and the
    # writer's memory would grow with the run although nothing else is held
    rows = [_row(ln, grades) for ln in lines]
    total, largest, n_images = 0, 0, 0
    missing: list[str] = []
    for i, ln in enumerate(lines):  # one trajectory's details and images in memory at a time
        row = rows[i]
        images: dict = {}
        blob = json.dumps(_sample_detail(run, run.full(ln), images, missing, dH, tf_dir, with_tokens, grounding,
                                         removal), ensure_ascii=False, default=str, separators=(",", ":"))
        near = {"prev": rows[i - 1]["file"] if i else None, "next": rows[i + 1]["file"] if i + 1 < len(rows) else None}
        page = _page({"__TITLE__": f"{html.escape(row['id'])} trial {row['trial']} — {title}",
                      "__META__": _js({**meta, "mode": "trajectory", "key": row["key"], **near}),
                      "__SAMPLES__": _js([row]),
                      "__DETAILS__": _js({row["key"]: base64.b64encode(gzip.compress(blob.encode(), 6)).decode()}),
                      "__IMAGES__": _js({k: v for k, v in images.items() if v})})
        (fdir / row["file"]).write_text(page, encoding="utf-8")
        size = len(page.encode())
        total, largest = total + size, max(largest, size)
        n_images += sum(1 for v in images.values() if v)
        if (i + 1) % LIST_CHUNK == 0 or i == len(lines) - 1:
            name = f"list-{i // LIST_CHUNK}.js"
            (fdir / name).write_text(f"MMCF_LIST({_js(rows[i // LIST_CHUNK * LIST_CHUNK: i + 1])});\n",
                                     encoding="utf-8")
    index = _page({"__TITLE__": title, "__META__": _js({**meta, "mode": "index", "summary": run_summary(run)}),
                   "__SAMPLES__": "[]", "__DETAILS__": "{}", "__IMAGES__": "{}"})
    out_path.write_text(index, encoding="utf-8")
    written = {r["file"] for r in rows} | {f"list-{j}.js" for j in range(meta["chunks"])}
    for stale in fdir.iterdir():  # pages of an earlier write of more trajectories
        if stale.name not in written and (stale.suffix == ".html" or re.fullmatch(r"list-\d+\.js", stale.name)):
            stale.unlink()
    total += len(index.encode()) + sum((fdir / f"list-{j}.js").stat().st_size for j in range(meta["chunks"]))
    return {"path": str(out_path), "files": str(fdir), "bytes": total, "samples": len(lines), "images": n_images,
            "missing_images": sorted(set(missing)), "tokens": with_tokens, "index_bytes": len(index.encode()),
            "largest_page_bytes": largest}


_PLACEHOLDER = re.compile(r"__(?:TITLE|META|SAMPLES|DETAILS|IMAGES)__")


def _js(obj) -> str:
    """JSON safe inside a <script> element: no ``<``, ``>`` or ``&`` left as such (an answer holding ``<!--<script>``
    or ``</script>`` would otherwise change how the HTML parser reads the rest of the page)."""
    return (json.dumps(obj, ensure_ascii=False, default=str)
            .replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))
