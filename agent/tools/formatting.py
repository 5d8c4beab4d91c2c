"""How tool results are shown to the model — one format for the live APIs and the offline world.

Both providers hand these functions the same plain records, so an agent cannot tell (from the
observation's shape) whether it ran against Serper/Jina or the offline corpus.
"""
from __future__ import annotations

BLOCK_MARKERS = (
    "verify you are human", "checking your browser", "just a moment...", "attention required! | cloudflare",
    "enable javascript and cookies to continue", "access denied", "captcha", "are you a robot",
    "403 forbidden", "cf-browser-verification", "ddos protection by",
)


def format_search(query: str, results: list[dict]) -> str:
    """results: [{"title", "link", "snippet"}], top-10, as a compact numbered list."""
    if not results:
        return f"A Google search for '{query}' found no results. Try a shorter or different query."
    lines = [f"A Google search for '{query}' found {len(results)} results:", ""]
    for i, r in enumerate(results, 1):
        lines.append(f"{i}. [{r.get('title') or '(no title)'}]({r.get('link', '')})")
        if r.get("snippet"):
            lines.append(f"   {r['snippet']}")
    return "\n".join(lines)


def format_lens(image_id: str, results: list[dict]) -> str:
    """results: [{"title", "link", "source"}], top-10 visually similar pages."""
    if not results:
        return f"Google Lens found no visually similar results for {image_id}."
    lines = [f"Google Lens found {len(results)} visually similar results for {image_id}:", ""]
    for i, r in enumerate(results, 1):
        src = f" ({r['source']})" if r.get("source") else ""
        lines.append(f"{i}. [{r.get('title') or '(no title)'}]({r.get('link', '')}){src}")
    return "\n".join(lines)


def format_visit(url: str, content: str, max_chars: int) -> str:
    body = content.strip()
    cut = ""
    if len(body) > max_chars:
        body, cut = body[:max_chars], f"\n\n[... truncated: showing {max_chars} of {len(content.strip())} characters]"
    return f"Content of {url}:\n\n{body}{cut}"


def failed_visit(url: str, why: str) -> str:
    return f"Failed to visit {url}: {why}. Try another source."


def looks_blocked(text: str, status: int | None = None) -> str | None:
    """A reason when a fetched page is a bot wall / block page rather than content."""
    if status in (401, 403, 429, 503):
        return f"the site answered HTTP {status} (blocked)"
    low = text[:4000].lower()
    for m in BLOCK_MARKERS:
        if m in low:
            return f"the page is a block page ('{m}')"
    if not text.strip():
        return "the page is empty"
    return None
