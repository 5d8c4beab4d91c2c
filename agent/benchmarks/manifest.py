"""A benchmark manifest in the release's unified format (``DATASET_DIR/<benchmark>/data_unified.jsonl`` + ``imgs/``):
its samples, the data problems found while loading it, and the checks on its images."""
from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath

from ..images import ImageError, load_image, max_image_bytes
from ..tools.demo_world import ensure_demo_world

__all__ = ["Sample", "Problem", "Manifest", "load_benchmark", "load_dataset_dir", "PAPER_CATEGORY",
           "resolve_benchmark", "ROW_SKIPPING"]

#: Paper §4.1: the three benchmark categories (plus the HLE-VL extra and the offline demo).
PAPER_CATEGORY = {
    "simplevqa": "Atomic factuality", "world_vqa": "Atomic factuality",
    "mmsearch": "Dynamic information-seeking", "livevqa": "Dynamic information-seeking",
    "browsecomp_vl": "Visual deep research", "mmsearch_plus": "Visual deep research", "vdr_bench": "Visual deep research",
    "hle_vl": "HLE-VL (extra)", "demo": "Demo (offline world)",
}


_PAPER_CATEGORIES = ("Atomic factuality", "Dynamic information-seeking", "Visual deep research")
#: What an id must not hold: C0 and C1 control characters (CR, LF, NUL, ESC…) and lone surrogates.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


@dataclass
class Sample:
    id: str
    query: str
    query_images: list[str]
    answer: str
    benchmark: str
    line: int
    image_dir: str = ""
    options: list[str] | None = None
    gt_option: str | None = None
    category: str | None = None          # the benchmark's own topical category, normalised
    paper_category: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def question(self) -> str:
        """The text the agent sees: the query, with the options appended when there are any."""
        if self.options:
            # a blank line, "Options:", one "- " bullet per option (release pipelines/base_pipeline.py:118-122)
            return self.query + "\n\nOptions:\n" + "\n".join(f"- {o}" for o in self.options)
        return self.query

    @property
    def image_paths(self) -> list[Path]:
        return [Path(self.image_dir) / f for f in self.query_images]

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Problem:
    line: int
    id: str
    kind: str
    detail: str
    kept: bool = False  # the row runs all the same (a repeated id under --protocol release: ID#LINE)

    @property
    def skips_a_row(self) -> bool:
        """The row is not run (the others are notes on a row that is: an empty gold answer, a category spelled as a
        JSON list, a repeated id the release protocol runs)."""
        return self.kind in ROW_SKIPPING and not self.kept


#: The problems whose row is left out of the manifest's samples: a run over it has another denominator.
ROW_SKIPPING = frozenset({"non_utf8", "torn_line", "missing_id", "bad_id", "duplicate_id", "missing_query",
                          "no_query_images", "path_outside_imgs", "bad_field"})


@dataclass
class Manifest:
    name: str
    path: Path
    samples: list[Sample]
    problems: list[Problem]

    @property
    def category(self) -> str:
        return PAPER_CATEGORY.get(self.name, "Uncategorised")

    def stats(self) -> dict:
        hist = Counter(str(len(s.query_images)) for s in self.samples)
        return {"samples": len(self.samples), "category": self.category,
                "images_per_sample": dict(sorted(hist.items(), key=lambda kv: int(kv[0]))),
                "problems": [asdict(p) for p in self.problems]}


def _norm_category(raw, line: int, sid: str, problems: list[Problem]):
    if isinstance(raw, list):
        return " / ".join(map(str, raw)) or None
    if isinstance(raw, str) and raw.strip().startswith("["):
        try:
            val = json.loads(raw)
        except json.JSONDecodeError:
            return raw
        problems.append(Problem(line, sid, "category_json_list", f"category is a JSON-list string: {raw[:80]}"))
        return " / ".join(map(str, val)) if isinstance(val, list) else raw
    return raw


def _inside_imgs(im) -> bool:
    """Whether a manifest's image path stays inside the benchmark's imgs/ (relative, no '..')."""
    if not isinstance(im, str) or not im or im.startswith(("/", "\\")) or ":" in im.split("/")[0]:
        return False
    return ".." not in Path(im).parts


def _resolves_inside(path: Path, root: Path) -> bool:
    """Whether ``path``'s real path (symbolic links followed) lies inside ``root`` (imgs/, itself resolved: an
    imgs/ that is a link to a shared image store is fine; a link inside it that leaves it is not)."""
    try:
        real = path.resolve()
    except (OSError, RuntimeError):  # a link loop
        return False
    return real == root or root in real.parents


def _image_problem(path: Path) -> tuple[str, str] | None:
    """(kind, detail) when the image cannot be used: missing, not a file, too large, not an image."""

    if not path.exists():
        return "missing_image", f"{path} not found"
    try:
        if path.is_file() and path.stat().st_size > max_image_bytes():
            return "image_too_large", f"{path}: {path.stat().st_size / 2**20:.1f} MB > {max_image_bytes() / 2**20:g} MB"
        load_image(path)
    except ImageError as e:
        return "not_an_image", str(e)
    return None


def _from_hle(row: dict) -> dict:
    """A WebWatcher HLE-VL row in the unified layout. WebWatcher's evaluation reads ``prompt`` (the question) and
    ``file_path``, whose file name names the image in its image directory (``infer/scripts_eval/agent_eval.py``,
    ``run_main``), and grades against ``answers[0]`` (``infer/evaluation/evaluate_hle_official.py``,
    ``extract_answer``); ``question`` / ``image(s)`` / ``answer`` rows and unified rows load too. A row without an
    ``id`` gets ``hle_`` + 12 hex of the sha256 of its question and image name (the same id in any copy of the
    file, whatever its row order)."""
    row = dict(row)
    if "query" not in row:
        row["query"] = row.pop("prompt", None) or row.pop("question", None)
    if "query_images" not in row:
        imgs = row.pop("images", None) or row.pop("image", None) or row.pop("image_path", None)
        if not imgs and isinstance(row.get("file_path"), str):  # WebWatcher: the file name, in its image directory
            imgs = PurePosixPath(row.pop("file_path")).name
        row["query_images"] = imgs if isinstance(imgs, list) else ([imgs] if imgs else [])
    if "answer" not in row and isinstance(row.get("answers"), list) and row["answers"]:
        row["answer"] = row.pop("answers")[0]
    if not str(row.get("id", "")).strip() and isinstance(row.get("query"), str):
        key = json.dumps([row["query"], row["query_images"]], ensure_ascii=False).encode()
        row["id"] = "hle_" + hashlib.sha256(key).hexdigest()[:12]
    return row


def _decode_row(f: Path, n: int, raw: bytes, problems: list) -> dict | None:
    """Line ``n`` as a JSON object, or None (a blank line; or a problem recorded: not UTF-8, not JSON)."""
    if n == 1 and raw.startswith(b"\xef\xbb\xbf"):  # a UTF-8 BOM: accepted (some editors write one)
        raw = raw[3:]
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        problems.append(Problem(n, "", "non_utf8", f"{f.name}:{n}: bytes that are not UTF-8 at offset {e.start} "
                                                  f"({raw[max(0, e.start - 10):e.start + 10]!r}); row skipped"))
        return None
    if not line.strip():
        return None
    try:
        row = json.loads(line)
        if not isinstance(row, dict):
            raise ValueError("not a JSON object")
    except ValueError as e:
        problems.append(Problem(n, "", "torn_line", f"{f.name}:{n}: not valid JSON ({e}): {line[:60]!r}"))
        return None
    return row


def _mistyped(row: dict) -> str | None:
    """What is wrong with the row's answer and options, if anything: the answer is text or a number, the options
    a list of texts."""
    answer, options = row.get("answer"), row.get("options")
    if answer is not None and (isinstance(answer, bool) or not isinstance(answer, (str, int, float))):
        return f"answer is {type(answer).__name__} {str(answer)[:60]!r}, not a text or a number"
    if options is not None and not (isinstance(options, list) and all(isinstance(o, (str, int, float))
                                                                      and not isinstance(o, bool) for o in options)):
        return f"options is {type(options).__name__} {str(options)[:60]!r}, not a list of texts"
    return None


def _paths_refused(imgs: list, img_dir: Path) -> str | None:
    """Why a row's image paths are refused (absolute, '..', or a symbolic link leaving imgs/), or None."""
    outside = [im for im in imgs if not _inside_imgs(im)]
    if outside:
        return f"image path(s) {outside[:3]} leave {img_dir} (absolute or '..'); row refused"
    if img_dir.is_dir():  # symlinks: the real path must stay inside imgs/ (ln -s /elsewhere imgs/r escapes it)
        root = img_dir.resolve()
        escaped = [im for im in imgs if not _resolves_inside(img_dir / im, root)]
        if escaped:
            return f"image path(s) {escaped[:3]} resolve outside {img_dir} (a symbolic link); row refused"
    return None


def load_benchmark(path: str | Path, name: str | None = None, *, check_images: bool = True,
                   keep_duplicates: bool = False) -> Manifest:
    """Load ``<dir>/data_unified.jsonl`` (or a .jsonl file); never raises on bad rows, reports them.
    ``keep_duplicates``: a row repeating an earlier id runs too, as ``ID#LINE`` (the release runs every row,
    ``pipelines/base_pipeline.py:103-116``); by default it is skipped (each id once, ours)."""
    p = Path(path)
    f = p / "data_unified.jsonl" if p.is_dir() else p
    if not f.exists():
        raise FileNotFoundError(f"{f}: benchmark manifest not found")
    bench = name or (f.parent.name if f.name == "data_unified.jsonl" else f.stem)
    img_dir = f.parent / "imgs"
    problems: list[Problem] = []
    samples: list[Sample] = []
    seen: set[str] = set()
    if check_images and not img_dir.is_dir():
        problems.append(Problem(0, "", "missing_image_dir", f"{img_dir} does not exist: no query image can be loaded"))
    with open(f, "rb") as fh:
        for n, raw in enumerate(fh, 1):
            row = _decode_row(f, n, raw, problems)
            if row is None:
                continue
            if bench == "hle_vl":
                row = _from_hle(row)
            sid = str(row.get("id", "")).strip()
            if not sid:
                problems.append(Problem(n, "", "missing_id", "row has no id"))
                continue
            if _CONTROL.search(sid):  # a CR/LF or NUL in an id would break every line and header it goes into
                problems.append(Problem(n, sid[:40], "bad_id", f"{f.name}:{n}: id {sid[:40]!r} holds control "
                                        "characters; row skipped"))
                continue
            if sid in seen:
                problems.append(Problem(n, sid, "duplicate_id", f"id {sid!r} already seen earlier; this row is "
                                        + (f"kept as {sid}#{n}" if keep_duplicates else "skipped"), kept=keep_duplicates))
                if not keep_duplicates:
                    continue
                sid = f"{sid}#{n}"
            seen.add(sid)
            query = row.get("query")
            imgs = row.get("query_images")
            if not isinstance(query, str) or not query.strip():
                problems.append(Problem(n, sid, "missing_query", "no query text; row skipped"))
                continue
            if isinstance(imgs, str):
                imgs = [imgs]
            if not isinstance(imgs, list) or not imgs:
                problems.append(Problem(n, sid, "no_query_images", "query_images missing or empty; row skipped"))
                continue
            refused = _paths_refused(imgs, img_dir)
            if refused:  # never read: a manifest must not point the toolkit at arbitrary files
                problems.append(Problem(n, sid, "path_outside_imgs", refused))
                continue
            answer = row.get("answer")
            bad = _mistyped(row)
            if bad:  # a list answer would be graded as its Python repr; options "ABCD" as four options
                problems.append(Problem(n, sid, "bad_field", f"{bad}; row skipped"))
                continue
            if answer is None or not str(answer).strip():
                problems.append(Problem(n, sid, "empty_answer", "gold answer is empty (kept; it cannot be graded correct)"))
            if check_images and img_dir.is_dir():
                for im in imgs:
                    problem = _image_problem(img_dir / im)
                    if problem:
                        problems.append(Problem(n, sid, problem[0], problem[1]))
            cat = _norm_category(row.get("category"), n, sid, problems)
            known = {"id", "query", "query_images", "answer", "options", "gt_option", "category", "source"}
            samples.append(Sample(
                id=sid, query=query, query_images=[str(i) for i in imgs], answer="" if answer is None else str(answer),
                benchmark=bench, line=n, image_dir=str(img_dir), options=row.get("options") or None,
                gt_option=row.get("gt_option"), category=cat,
                # the demo benchmark spans the paper's three categories, one row each way (its rows say which)
                paper_category=(cat if bench == "demo" and cat in _PAPER_CATEGORIES else
                                PAPER_CATEGORY.get(bench, "Uncategorised")),
                extra={k: v for k, v in row.items() if k not in known}))
    return Manifest(bench, f, samples, problems)


#: Where a user is told to look for the benchmark data and its layout.
DATA_HELP = "README.md, section \"The benchmark data\" (the release's manifests, each benchmark's image source)"


def load_dataset_dir(root: str | Path, *, check_images: bool = True) -> dict[str, Manifest]:
    root = Path(root)
    expected = f"{root}/<benchmark>/data_unified.jsonl and {root}/<benchmark>/imgs/"
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: dataset directory not found (expected {expected}; see {DATA_HELP})")
    out = {d.name: load_benchmark(d, check_images=check_images)
           for d in sorted(root.iterdir()) if (d / "data_unified.jsonl").exists()}
    if not out:
        raise FileNotFoundError(f"{root}: no <benchmark>/data_unified.jsonl found (expected {expected}, e.g. "
                                f"{root}/mmsearch/data_unified.jsonl; see {DATA_HELP})")
    return out


def resolve_benchmark(name_or_path: str, *, keep_duplicates: bool = False) -> Manifest:
    """``demo`` = the offline demo benchmark; else a benchmark directory or .jsonl path."""
    if name_or_path == "demo":
        return load_benchmark(ensure_demo_world() / "demo", "demo", keep_duplicates=keep_duplicates)
    return load_benchmark(name_or_path, keep_duplicates=keep_duplicates)
