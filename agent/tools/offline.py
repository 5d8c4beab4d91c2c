"""Offline tool world: the same three tools answered from a local corpus, formatted like the live ones.

    provider = OfflineProvider("path/to/world")     # world/pages.jsonl + world/images/

``search``: SQLite FTS5 over page titles and text, BM25-ranked, top 10. ``lens_search``: pages that
show the query image, matched by content hash and, for re-encoded or resized copies, by a
perceptual difference hash (Hamming distance <= ``phash_max_distance``). ``visit``: the page by URL
(block pages in the corpus are reported as failed visits, like the live tool does).
This is the embedded default world and the test fixture; it costs nothing (``paid_calls = 0``).
"""
from __future__ import annotations

import hashlib
import json
import re
import sqlite3
from pathlib import Path

from PIL import Image

from ..errors import UsageError
from ..paths import inside
from .formatting import FAILED_VISIT, format_lens, format_search, format_visit, looks_blocked
from .live import ProviderResult
from .registry import RegisteredImage

__all__ = ["OfflineProvider", "dhash", "WorldError"]


class WorldError(UsageError, ValueError):
    """A missing or malformed offline world."""


def dhash(img, size: int = 8) -> int:
    """64-bit difference hash of a PIL image (robust to resizing and re-encoding)."""
    g = img.convert("L").resize((size + 1, size))
    px = list(g.tobytes())
    bits = 0
    for r in range(size):
        row = px[r * (size + 1): (r + 1) * (size + 1)]
        for c in range(size):
            bits = (bits << 1) | (1 if row[c] > row[c + 1] else 0)
    return bits


class OfflineProvider:
    kind = "offline"

    def __init__(self, world_dir: str | Path, *, visit_max_chars: int | None = None, phash_max_distance: int = 10,
                 max_results: int | None = 10):
        root = Path(world_dir)
        root = root / "world" if (root / "world" / "pages.jsonl").exists() else root
        pages = root / "pages.jsonl"
        if not pages.exists():
            raise WorldError(f"{pages}: offline world not found (expected pages.jsonl)")
        self.visit_max_chars = visit_max_chars
        self.phash_max_distance = phash_max_distance
        self.max_results = max_results  # search results listed (None: all, as the release lists them)
        self.db = sqlite3.connect(":memory:", check_same_thread=False)
        self.db.execute("CREATE VIRTUAL TABLE pages USING fts5(url UNINDEXED, title, text, tokenize='porter unicode61')")
        self.pages: dict[str, dict] = {}
        self.by_sha: dict[str, list[str]] = {}
        self.by_phash: list[tuple[int, str]] = []
        self.page_images: dict[str, list[dict]] = {}   # url -> [{"sha256", "path"}]: lens result thumbnails
        for n, line in enumerate(pages.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                p = json.loads(line)
                url, title, text = p["url"], p.get("title", ""), p.get("text", "")
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise WorldError(f"{pages}:{n}: malformed page record ({e})") from None
            self.pages[url] = p
            self.db.execute("INSERT INTO pages(url, title, text) VALUES (?,?,?)", (url, title, text))
            for fn in p.get("images", []):
                f = inside(root / "images", fn, f"{pages}:{n}: image", WorldError)
                try:
                    data = f.read_bytes()
                    with Image.open(f) as im:
                        ph = dhash(im)
                except OSError as e:
                    raise WorldError(f"{f}: image of page {url} unreadable ({e})") from None
                sha = hashlib.sha256(data).hexdigest()
                self.by_sha.setdefault(sha, []).append(url)
                self.by_phash.append((ph, url))
                self.page_images.setdefault(url, []).append({"sha256": sha, "path": str(f)})

    @staticmethod
    def _fts_query(q: str) -> str:
        words = [w for w in re.findall(r"\w+", q.lower()) if len(w) > 1]
        return " OR ".join(f'"{w}"' for w in words)

    async def search(self, query) -> ProviderResult:
        fq = self._fts_query(str(query))
        rows = []
        if fq:
            cur = self.db.execute(
                "SELECT url, title, snippet(pages, 2, '', '', '…', 24) FROM pages WHERE pages MATCH ? "
                "ORDER BY bm25(pages) LIMIT ?", (fq, -1 if self.max_results is None else self.max_results))
            rows = [{"title": t, "link": u, "snippet": s} for u, t, s in cur.fetchall()]
        return ProviderResult(format_search(query, rows), raw={"organic": rows})

    async def lens(self, img: RegisteredImage) -> ProviderResult:
        urls = list(self.by_sha.get(img.sha256, []))
        if not urls:
            ph = dhash(img.image.pil())
            scored = sorted((bin(ph ^ h).count("1"), u) for h, u in self.by_phash)
            urls = [u for d, u in scored if d <= self.phash_max_distance]
        seen, rows = set(), []
        for u in urls:
            if u not in seen:
                seen.add(u)
                rows.append({"title": self.pages[u].get("title", ""), "link": u, "source": u.split("/")[2]})
        # as live Lens keeps them: up to 10 thumbnails from the first 30 results, each with its result
        thumbs = [{**self.page_images[r["link"]][0], "rank": i, "title": r["title"], "link": r["link"]}
                  for i, r in enumerate(rows[:30]) if self.page_images.get(r["link"])][:10]
        return ProviderResult(format_lens(img.image_id, rows[:10]), raw={"organic": rows[:10], "thumbnails": thumbs})

    async def visit(self, url) -> ProviderResult:
        url = str(url)
        p = self.pages.get(url) or self.pages.get(url.rstrip("/")) or self.pages.get(url.rstrip("/") + "/")
        if p is None:
            return ProviderResult(FAILED_VISIT, raw={"status": 404, "blocked": "HTTP 404 (page not found)"}, ok=False)
        text = f"# {p.get('title', '')}\n\n{p.get('text', '')}"
        why = looks_blocked(p.get("text", ""))
        if why:
            return ProviderResult(FAILED_VISIT, raw={"blocked": why}, ok=False)
        return ProviderResult(format_visit(url, text, self.visit_max_chars), raw={"reader": "offline", "content": text})

    def require(self, tools) -> None:
        return None

    async def aclose(self) -> None:
        self.db.close()
