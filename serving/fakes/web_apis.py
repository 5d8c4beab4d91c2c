"""Loopback stand-ins for Serper (/search, /lens, scrape) and Jina Reader, with their response shapes.

``server.faults`` is consumed one per request: "429", "500", or None; ``server.fail`` maps a path ("/search",
"/lens", "/scrape", a Jina page "/https://…") to how many of its next requests answer 500. ``server.pages`` maps a URL to the markdown
Jina returns for it (a block page is just a page whose text is a bot wall). ``server.bodies`` lists each POST's path
and JSON body, ``server.log`` every request; ``server.lens_results`` is how many results Lens returns,
``server.lens_items`` replaces them (a result without a title, a JPEG or redirected thumbnail), ``server.search_items``
the organic search results, and
``server.bad_thumbs`` the result numbers whose thumbnail answers 404, ``server.lens_field`` where Lens puts its
results. Thumbnails: ``/thumb/N.png`` (PNG),
``/thumb/N.jpg`` (JPEG), ``/moved/N.png`` (a 302 to ``/thumb/N.png``).
"""
from __future__ import annotations

import json
import threading
from http.server import ThreadingHTTPServer

from serving.fakes.http_base import JSONHandler


class _H(JSONHandler):
    server: "FakeWeb"

    def _pre(self):
        with self.server.lock:
            self.server.log.append((self.command, self.path, dict(self.headers)))
            n = int(self.headers.get("Content-Length") or 0) if self.command == "POST" else 0
            self._body = json.loads(self.rfile.read(n) or b"{}") if n else {}
            if self.command == "POST":
                self.server.bodies.append((self.path, self._body))
            f = self.server.faults.pop(0) if self.server.faults else None
            if f is None and self.server.fail.get(self.path):
                self.server.fail[self.path] -= 1
                f = "500"
        if f in ("429", "500", "403"):
            self._send(int(f), {"message": "fault"})
            return True
        return False

    def do_GET(self):  # Jina Reader: GET /https://site/page
        if self._pre():
            return
        if self.path.startswith("/moved/"):
            self.send_response(302)
            self.send_header("Location", "/thumb/" + self.path[7:])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        if self.path.startswith("/thumb/"):
            n, ext = self.path[7:].split(".")
            if int(n) in self.server.bad_thumbs:
                return self._send(404, "gone", "text/plain")
            return self._send(200, thumbnail(int(n), ext), "image/jpeg" if ext == "jpg" else "image/png")
        url = self.path.lstrip("/")
        if url in self.server.pages:
            return self._send(200, self.server.pages[url], "text/plain")  # UTF-8 bytes, no charset named
        self._send(404, "not found", "text/plain")

    def do_POST(self):
        if self._pre():
            return
        body = self._body
        if self.path == "/search":
            q = body.get("q", "")
            if "nothing" in q:
                return self._send(200, {"searchParameters": {"q": q, "type": "search"}, "organic": []})
            org = self.server.search_items if self.server.search_items is not None else [
                {"title": f"Result {i} for {q}", "link": f"https://site{i}.example/{i}", "snippet": f"snippet {i}",
                 "position": i} for i in range(1, 13)]
            return self._send(200, {"searchParameters": {"q": q, "type": "search", "engine": "google"}, "organic": org,
                                    "credits": 1})
        if self.path == "/lens":
            items = self.server.lens_items if self.server.lens_items is not None else [
                {"title": f"Lens match {i}", "source": "example.org", "link": f"https://match{i}.example/",
                 "imageUrl": "https://img/x.jpg", "thumbnailUrl": f"{self.server.url}/thumb/{i}.png"}
                for i in range(1, self.server.lens_results + 1)]
            return self._send(200, {"searchParameters": {"url": body.get("url"), "type": "lens"},
                                    self.server.lens_field: items})
        if self.path == "/scrape":
            url = body.get("url", "")
            return self._send(200, {"text": self.server.scrape.get(url, ""), "metadata": {"title": "t"}})
        self._send(404, {"message": "no route"})


def thumbnail(n: int, ext: str = "png") -> bytes:
    """Thumbnail ``n``: an 8x8 image in its own colour, PNG or JPEG bytes."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (n * 20 % 255, 0, 0)).save(buf, "JPEG" if ext == "jpg" else "PNG")
    return buf.getvalue()


class FakeWeb(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _H)
        self.faults: list = []
        self.pages: dict[str, str] = {}
        self.scrape: dict[str, str] = {}
        self.log: list = []
        self.bodies: list = []
        self.lens_results = 14
        self.lens_items: list | None = None
        self.lens_field = "organic"  # where Lens puts its results ("visual_matches": a reply with no organic)
        self.search_items: list | None = None
        self.bad_thumbs: set = set()
        self.fail: dict[str, int] = {}
        self.lock = threading.Lock()
        self._t = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *e):
        self.shutdown()
        self.server_close()
