"""How the tool layer treats a call: a protocol's choice, passed down to the toolbox and the live provider.

    Toolbox(LiveProvider.from_env(tools=RELEASE_TOOLS), tools=RELEASE_TOOLS)   # what --protocol release runs

Two policies, one per protocol (docs/fidelity.md has a row for each difference):

- :data:`DEFAULT_TOOLS` (``--protocol paper``): the paper's top 10 results (§4.1), and ours where the paper is silent
  and the release has a defect: arguments stripped, an empty one or a URL without a scheme answered without a paid
  request, repeats answered from ``tools.sqlite``, 429/5xx retried with backoff, an API failure said as such, a
  scrape fallback shown as its markdown, block pages found by our markers, thumbnails kept as received.
- :data:`RELEASE_TOOLS` (``--protocol release``): what the authors' release does (iLearn-Lab/MM26-MMContextFold
  @16fa474, ``utils/search_tools.py``): arguments as given, no cache, its attempts and pauses with every non-2xx
  retried, every organic result, "No results found" for an API failure, the scrape body as returned, its
  case-sensitive block markers, thumbnails re-encoded to PNG, a missing title shown as ``None``, timeouts per read,
  URLs re-quoted as requests sends them, Lens results under ``organic`` only, a null result row failing the call
  with the release's own error text.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..http import RetryPolicy

__all__ = ["ToolPolicy", "DEFAULT_TOOLS", "RELEASE_TOOLS", "TOOL_POLICIES", "POLICY_NAMED", "release_blocked"]

#: The release's block-page markers: matched case-sensitively anywhere in the page, Jina's list
#: (``call_visit_jina``) and the scrape's, which lacks the last one (``call_visit_serper``).
RELEASE_JINA_MARKERS = ("Verify you are human", "Cloudflare", "Just a moment...", "Ray ID:", "403 Forbidden",
                        "Access Denied", "Target URL returned error")
RELEASE_SCRAPE_MARKERS = RELEASE_JINA_MARKERS[:-1]


@dataclass(frozen=True)
class ToolPolicy:
    name: str                        # recorded in the run header (``tools.policy``)
    clean_args: bool                 # strip arguments; an empty one or a scheme-less URL gets no request
    cache: bool                      # repeats answered from the cache; concurrent identical calls share one request
    max_results: int | None          # organic search results listed (None: all)
    search: RetryPolicy              # each service's attempts, pauses and timeout
    lens: RetryPolicy
    jina: RetryPolicy
    scrape: RetryPolicy
    thumbnail: RetryPolicy
    say_api_failure: bool            # an API failure says so (ours) or reads as "No results found" (the release)
    scrape_as_body: bool             # the scrape fallback shows its whole JSON body (the release) or its markdown
    release_markers: bool            # block pages by the release's markers (else ours, agent/tools/formatting.py)
    thumbnails_png: bool             # Lens thumbnails re-encoded to PNG (the release) or kept as received
    missing_title: str | None        # a Lens result without a title in a branch: this text, or None shown as "None"
    python_values: bool              # search rows as the release's f-strings show them: a null title reads "None", a
    #                                  missing title or link fails the call with its KeyError ("Tool error: 'title'")
    text_charset: str | None         # a page served as text/* naming no charset: this one (the release's requests
    #                                  library: ISO-8859-1), or None for UTF-8
    requote_urls: bool = False       # URLs put on the wire as requests re-quotes them (agent/http.py requote_uri)
    lens_fields: tuple = ("organic", "visual_matches", "visualMatches")  # where Lens results are read, first found

    def with_retries(self, policy: RetryPolicy) -> "ToolPolicy":
        """The same policy with every service's retries replaced (tests: no pauses)."""
        return replace(self, search=policy, lens=policy, jina=policy, scrape=policy, thumbnail=policy)


_OURS = RetryPolicy(retries=3, timeout_s=45)
DEFAULT_TOOLS = ToolPolicy(
    name="default", clean_args=True, cache=True, max_results=10,
    search=_OURS, lens=_OURS, jina=_OURS, scrape=_OURS, thumbnail=RetryPolicy(retries=0, timeout_s=15),
    say_api_failure=True, scrape_as_body=False, release_markers=False, thumbnails_png=False, missing_title="Result",
    python_values=False, text_charset=None)

RELEASE_TOOLS = ToolPolicy(
    name="release", clean_args=False, cache=False, max_results=None,
    # utils/search_tools.py: t2t_search_serper (5 attempts, 3 s apart, 60 s), i2i_search_serper (5, no pause, 100 s),
    # call_visit_jina (3, 0.5 s, 50 s), call_visit_serper (10, 0.5 s, 50 s), img_download (one, 10 s); every
    # request error, a non-2xx status included (raise_for_status / the status check), is retried
    # requests' timeout bounds the connect and each read, not the whole transfer (per_read)
    search=RetryPolicy(retries=4, pause_s=3.0, retry_any_status=True, timeout_s=60, per_read=True),
    lens=RetryPolicy(retries=4, pause_s=0.0, retry_any_status=True, timeout_s=100, per_read=True),
    jina=RetryPolicy(retries=2, pause_s=0.5, retry_any_status=True, timeout_s=50, per_read=True),
    scrape=RetryPolicy(retries=9, pause_s=0.5, retry_any_status=True, timeout_s=50, per_read=True),
    thumbnail=RetryPolicy(retries=0, timeout_s=10, per_read=True),
    say_api_failure=False, scrape_as_body=True, release_markers=True, thumbnails_png=True, missing_title=None,
    # utils/search_tools.py:93 f"{idx}. [{page['title']}]({page['link']})"; requests' Response.text
    python_values=True, text_charset="ISO-8859-1",
    # requests re-quotes every URL it sends; i2i_search_serper reads Lens results under "organic" only (:150-157)
    requote_urls=True, lens_fields=("organic",))

TOOL_POLICIES = {"paper": DEFAULT_TOOLS, "release": RELEASE_TOOLS}  # by --protocol
POLICY_NAMED = {p.name: p for p in (DEFAULT_TOOLS, RELEASE_TOOLS)}    # by the run header's tools.policy


def release_blocked(text: str, markers=RELEASE_JINA_MARKERS) -> str | None:
    """A reason when the release would take ``text`` for no page: empty after stripping, or holding one of its
    markers (case-sensitive, anywhere)."""
    if not text.strip():
        return "the page is empty"
    hit = next((m for m in markers if m in text), None)
    return f"the page is a block page ('{hit}')" if hit else None
