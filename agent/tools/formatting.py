"""How tool results are shown to the model — one format for the live APIs and the offline world.

Both providers hand these functions the same plain records, so an agent cannot tell (from the
observation's shape) whether it ran against Serper/Jina or the offline corpus. Search and visit texts are the
authors' release's (iLearn-Lab/MM26-MMContextFold @16fa474, ``utils/search_tools.py``), which the paper does not
print; the Lens list ReAct sees is ours, and an MM-ContextFold branch gets the release's own (``format_lens_branch``).
"""
from __future__ import annotations

BLOCK_MARKERS = (
    "verify you are human", "checking your browser", "just a moment...", "attention required! | cloudflare",
    "enable javascript and cookies to continue", "access denied", "captcha", "are you a robot",
    "403 forbidden", "cf-browser-verification", "ddos protection by",
)


def _tool_block(tool: str, query: str, success: bool, count: int = 0, results: str = "") -> str:
    """The release's result block (``utils/search_tools.py:23-43``). Its Goal line is always empty there
    (``SearchTools.text_search`` passes ``goal=""``, ``:346``), and so it is here."""
    head = f"## {tool} Results\n\n**Query:** {query}\n**Goal:** \n**Status:** {'Success' if success else 'Failed'}\n"
    if not success:
        return head + "\nNo results found. Try to fix the current query or use a different tool."
    return head + f"**Count:** {count} results\n\n### Results:\n{results}"


def format_search(query: str, results: list[dict], python_values: bool = False) -> str:
    """results: [{"title", "link", "snippet"}], the top 10, as the release lists them: 0-based, each snippet
    indented under its link, blank lines between (``utils/search_tools.py:90-99``). A null title or link shows as
    nothing (ours); ``python_values``: as the release's f-string shows it (``None``), and a row without one fails the
    whole call as the release's ``page['title']`` does (its KeyError, caught by ``_execute_tool``:
    ``pipelines/pipeline_mmcontextfold.py`` "Tool error: ...")."""
    if not results:
        return _tool_block("text_search", query, False)
    if python_values:  # the first row the release's loop fails on, as it fails (:90-93: .get, then ['title'], ['link'])
        for r in results:
            if not isinstance(r, dict):
                return f"Tool error: '{type(r).__name__}' object has no attribute 'get'"
            missing = next((k for k in ("title", "link") if k not in r), None)
            if missing:
                return f"Tool error: '{missing}'"

    def shown(r: dict, key: str) -> str:
        return str(r[key]) if python_values else (r.get(key) or "")
    rows = [f"{i}. [{shown(r, 'title')}]({shown(r, 'link')})" + (f"\n  {r['snippet']}" if r.get("snippet") else "")
            for i, r in enumerate(results)]
    return _tool_block("text_search", query, True, len(rows), "\n\n".join(rows))


def format_lens(image_id: str, results: list[dict]) -> str:
    """results: [{"title", "link", "source"}], top-10 visually similar pages (the observation ReAct and the
    folding baselines get; an MM-ContextFold branch gets :func:`format_lens_branch`)."""
    if not results:
        return f"Google Lens found no visually similar results for {image_id}."
    lines = [f"Google Lens found {len(results)} visually similar results for {image_id}:", ""]
    for i, r in enumerate(results, 1):
        src = f" ({r['source']})" if r.get("source") else ""
        lines.append(f"{i}. [{r.get('title') or '(no title)'}]({r.get('link', '')}){src}")
    return "\n".join(lines)


#: The release's lens observation inside a branch when nothing came back (``pipelines/pipeline_mmcontextfold.py:383-400``).
LENS_BRANCH_EMPTY = "lens_search returned no results. Try a different approach such as text search."


def format_lens_branch(image_id: str, results: list[dict], missing: str | None = "Result") -> str:
    """An MM-ContextFold branch's lens observation, as the release writes it (``pipelines/pipeline_mmcontextfold.py:383-400``, ``:305-308``):
    only the results whose thumbnail arrived (``results``: [{"title", "link"}], in the order of their images),
    named ``<result#1>``…, then the instruction to compare each attached image with the query image.
    ``missing``: what a result without a title shows (ours: "Result"); None shows the value as the release does
    (a title or link Serper did not send reads ``None`` there)."""
    if not results:
        return LENS_BRANCH_EMPTY

    def shown(r: dict, key: str, fallback: str) -> str:
        return str(r.get(key)) if missing is None else (r.get(key) or fallback)
    rows = [f"<result#{i}>: **{shown(r, 'title', str(missing))}**\n   URL: {shown(r, 'link', '')}"
            for i, r in enumerate(results, 1)]
    return (f"Reverse image search results for {image_id}:\n\n" + "\n\n".join(rows)
            + f"\n\nThe result images are attached in the same order (<result#1> ~ <result#{len(rows)}>). "
            f"Compare each result image with the query image {image_id} and "
            "use both visual and text information to continue your task.")


def format_visit(url: str, content: str, max_chars: int | None = None) -> str:
    """The page text as the reader returned it, stripped, no header (``utils/search_tools.py``, ``call_visit_jina``
    and ``SearchTools.visit_page``); no length cap unless ``max_chars`` is given (the release has none)."""
    body = content.strip()
    if max_chars is not None and len(body) > max_chars:
        body = body[:max_chars] + f"\n\n[... truncated: showing {max_chars} of {len(content.strip())} characters]"
    return body


#: The release's text for a page no reader could read (``utils/search_tools.py``, ``SearchTools.visit_page``);
#: the reason goes to the record.
FAILED_VISIT = "Failed to read page content."


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
