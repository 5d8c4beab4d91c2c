"""Tools: live providers against loopback Serper/Jina, the offline world, the record/replay cache."""
import asyncio
import json
import multiprocessing as mp
import sqlite3

import pytest

from agent.http import RetryPolicy
from agent.tools import (
    CacheMiss,
    ImageRegistry,
    LensURL,
    LiveProvider,
    MissingKeyError,
    OfflineProvider,
    Toolbox,
    ToolCache,
)
from agent.tools.demo_world import QUESTIONS, build_demo_world
from agent.tools.policy import DEFAULT_TOOLS
from serving.fakes.web_apis import FakeWeb

FAST = RetryPolicy(retries=2, backoff_s=0.01, timeout_s=5)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_demo_world(tmp_path_factory.mktemp("world"))


@pytest.fixture
def web():
    with FakeWeb() as w:
        yield w


def live(web, **kw):
    return LiveProvider(serper_key="sk-test-SECRET", jina_key="jina-SECRET", serper_base=web.url,
                        scrape_base=web.url + "/scrape", jina_base=web.url, tools=DEFAULT_TOOLS.with_retries(FAST), **kw)


async def test_live_search_sends_and_shows_what_the_release_does(web):
    tb = Toolbox(live(web))
    r = await tb.call("search", {"query": "kestrel observatory", "goal": "x"})
    # the request: q and location, no num (release utils/search_tools.py:64)
    assert web.bodies[-1] == ("/search", {"q": "kestrel observatory", "location": "United States"})
    assert web.log[-1][2]["X-API-KEY"] == "sk-test-SECRET"
    # the text: the release's block (utils/search_tools.py:23-43), 0-based rows with indented snippets (:90-99),
    # the top 10 (paper §4.1)
    head = "## text_search Results\n\n**Query:** kestrel observatory\n**Goal:** \n**Status:** Success\n**Count:** 10 results"
    assert r.ok and r.observation.startswith(head + "\n\n### Results:\n0. [Result 1 for kestrel observatory]"
                                              "(https://site1.example/1)\n  snippet 1\n\n1. [Result 2")
    assert r.observation.endswith("9. [Result 10 for kestrel observatory](https://site10.example/10)\n  snippet 10")
    assert "SECRET" not in r.observation
    r = await tb.call("search", {"query": "nothing at all"})
    assert r.ok and r.observation.endswith("**Status:** Failed\n\nNo results found. Try to fix the current query "
                                           "or use a different tool.")


async def test_live_429_then_success_and_500_exhausted(web):
    tb = Toolbox(live(web))
    web.faults = ["429", None]
    r = await tb.call("search", {"query": "a"})
    assert r.ok and len(web.log) == 2
    web.faults = ["500"] * 5
    r = await tb.call("search", {"query": "b"})
    assert not r.ok and "HTTP 500" in r.observation and "SECRET" not in r.observation


async def test_live_visit_block_page_falls_back_to_scrape_then_fails(web):
    url = "https://news.example/story"
    web.pages[url] = "# Story\n\nThe answer is 42.\n"
    r = await Toolbox(live(web)).call("visit", {"url": url, "goal": "g"})
    # the page as the reader returned it, stripped, no header, no cap (release utils/search_tools.py, visit_page);
    # Jina asked to strip links and images (:249-253)
    assert r.ok and r.observation == "# Story\n\nThe answer is 42."
    assert {k: web.log[-1][2][k] for k in ("X-Md-Link-Style", "X-Retain-imgs", "X-Return-Format")} == \
        {"X-Md-Link-Style": "discarded", "X-Retain-imgs": "none", "X-Return-Format": "markdown"}
    r = await Toolbox(live(web, visit_max_chars=10)).call("visit", {"url": url})
    assert r.observation.startswith("# Story\n\nT") and "truncated: showing 10 of" in r.observation  # a cap if asked
    tb = Toolbox(live(web))
    blocked = "https://cf.example/p"
    web.pages[blocked] = "Just a moment... Verify you are human"
    web.scrape[blocked] = "Attention Required! | Cloudflare"
    r = await tb.call("visit", {"url": blocked})
    assert not r.ok and r.observation == "Failed to read page content." and "block page" in r.raw["blocked"]
    assert web.bodies[-1] == ("/scrape", {"url": blocked, "includeMarkdown": True})
    web.scrape["https://x.example/forbidden"] = "Real article text from scrape."
    web.faults = ["403"]
    r = await tb.call("visit", {"url": "https://x.example/forbidden"})
    assert r.ok and "Real article text" in r.observation


async def test_live_lens_needs_public_url(web, world):
    reg = ImageRegistry.from_paths([world / "demo/imgs/kestrel_logo.png"], "demo")
    r = await Toolbox(live(web)).call("lens_search", {"image_id": "<image_0>"}, reg)
    assert not r.ok and "no public URL" in r.observation
    tb = Toolbox(live(web, lens_url=LensURL(template="https://host/{benchmark}/{filename}")))
    r = await tb.call("lens_search", {"image_id": "image_0"}, reg)
    assert r.ok and "10. [Lens match 10]" in r.observation
    # url, num 100 and location (release utils/search_tools.py:150)
    assert web.bodies[-1] == ("/lens", {"url": f"https://host/demo/{reg.images[0].filename}", "num": 100,
                                        "location": "United States"})


async def test_lens_thumbnails_saved_and_s3_presigned_url(web, world, tmp_path, monkeypatch):
    import sys
    import types

    reg = ImageRegistry.from_paths([world / "demo/imgs/kestrel_logo.png"], "demo")
    calls = {}

    class FakeS3:  # the two boto3 S3 client calls the uploader uses
        def put_object(self, **kw):
            calls["put"] = kw

        def generate_presigned_url(self, op, Params, ExpiresIn):
            calls["presign"] = (op, Params, ExpiresIn)
            return f"https://bucket.example/{Params['Key']}?sig=x"

    monkeypatch.setitem(sys.modules, "boto3", types.SimpleNamespace(client=lambda *a, **kw: FakeS3()))
    tb = Toolbox(live(web, lens_url=LensURL(s3_bucket="b"), thumbnail_dir=tmp_path / "thumbs"))
    r = await tb.call("lens_search", {"image_id": "<image_0>"}, reg)
    assert r.ok and calls["put"]["Bucket"] == "b" and calls["put"]["Key"].endswith(reg.images[0].sha256 + ".png")
    saved = r.raw["saved_thumbnails"]
    assert len(saved) == 10 and all((tmp_path / "thumbs" / t["path"].split("/")[-1]).exists() for t in saved)


async def test_lens_keeps_up_to_10_thumbnails_from_the_first_30_results(web, world, tmp_path):
    """release utils/search_tools.py:177 (max_imgs=10), img_download :200-240: the first 30 results are tried, a
    result whose thumbnail does not arrive is left out, the first 10 that arrive are kept with their result."""
    reg = ImageRegistry.from_paths([world / "demo/imgs/kestrel_logo.png"], "demo")
    web.lens_results, web.bad_thumbs = 40, set(range(1, 28)) - {2, 5}
    tb = Toolbox(live(web, lens_url=LensURL(template="https://host/{filename}"), thumbnail_dir=tmp_path / "t"))
    r = await tb.call("lens_search", {"image_id": "<image_0>"}, reg)
    assert [t["title"] for t in r.raw["saved_thumbnails"]] == [f"Lens match {i}" for i in (2, 5, 28, 29, 30)]
    assert [t["link"] for t in r.raw["saved_thumbnails"]][:2] == ["https://match2.example/", "https://match5.example/"]
    web.bad_thumbs = set()
    r = await Toolbox(live(web, lens_url=LensURL(template="https://h/{filename}"), thumbnail_dir=tmp_path / "u")).call(
        "lens_search", {"image_id": "<image_0>"}, reg)
    assert [t["rank"] for t in r.raw["saved_thumbnails"]] == list(range(10))


def test_missing_keys_fail_at_start():
    p = LiveProvider(serper_key=None, jina_key=None)
    with pytest.raises(MissingKeyError, match="SERPER_API_KEY"):
        p.require(["search"])
    LiveProvider(serper_key=None, jina_key="j").require(["visit"])


async def test_offline_world_answers_every_demo_question(world):
    tb = Toolbox(OfflineProvider(world))
    for qid, query, imgs, answer, _ in QUESTIONS:
        reg = ImageRegistry.from_paths([world / "demo/imgs" / f"{n}.png" for n in imgs], "demo")
        lens = await tb.call("lens_search", {"image_id": "<image_0>"}, reg)
        assert lens.ok and "1. [" in lens.observation, qid  # found through the re-encoded web copy
        title = lens.observation.split("1. [")[1].split("]")[0]
        entity = title.split(" — ")[0].split(" by ")[0].replace("Flag of ", "")
        found = await tb.call("search", {"query": entity}, reg)
        urls = [l.split("](")[1].rstrip(")") for l in found.observation.splitlines() if "](" in l]
        texts = [(await tb.call("visit", {"url": u}, reg)).observation for u in urls]
        assert any(answer.split(";")[0] in t for t in texts), (qid, entity)


async def test_invalid_calls_are_observations(world):
    tb = Toolbox(OfflineProvider(world))
    assert "Unknown tool" in (await tb.call("browse", {})).observation
    assert "needs a non-empty string argument 'query'" in (await tb.call("search", {"q": "x"})).observation
    r = await tb.call("lens_search", {"image_id": "/etc/passwd"}, ImageRegistry())
    assert not r.ok and "Unknown image id" in r.observation
    assert tb.stats["invalid_calls"] == 3


async def test_cache_modes(world, tmp_path):
    cache = ToolCache(tmp_path / "c.sqlite")
    tb = Toolbox(OfflineProvider(world), cache=cache)
    a = await tb.call("search", {"query": "Valdoria capital", "goal": "g1"})
    b = await tb.call("search", {"query": "  Valdoria   capital ", "goal": "other goal"})
    assert not a.cache_hit and b.cache_hit and a.observation == b.observation
    rp = Toolbox(OfflineProvider(world), cache=cache, mode="replay")
    assert (await rp.call("search", {"query": "Valdoria capital"})).cache_hit
    with pytest.raises(CacheMiss):
        await rp.call("search", {"query": "never asked"})
    fb = Toolbox(OfflineProvider(world), cache=cache, mode="replay", live_fallback=True)
    assert not (await fb.call("search", {"query": "never asked"})).cache_hit
    off = Toolbox(OfflineProvider(world), cache=cache, mode="off")
    assert not (await off.call("search", {"query": "Valdoria capital"})).cache_hit
    assert tb.stats["cache.hits"] == 1 and tb.stats["cache.misses"] == 1


async def test_transient_failures_are_retried_in_readwrite_but_replayed(web, tmp_path):
    cache = ToolCache(tmp_path / "c.sqlite")
    tb = Toolbox(live(web), cache=cache)
    web.faults = ["500"] * 3
    assert not (await tb.call("search", {"query": "q"})).ok
    assert (await Toolbox(live(web), cache=cache, mode="replay").call("search", {"query": "q"})).ok is False
    r = await tb.call("search", {"query": "q"})
    assert r.ok and not r.cache_hit and tb.stats["paid_calls"] == 2
    assert (await Toolbox(live(web), cache=cache, mode="replay").call("search", {"query": "q"})).ok


async def test_concurrent_identical_calls_pay_once(web, tmp_path):
    tb = Toolbox(live(web), cache=ToolCache(tmp_path / "c.sqlite"))
    res = await asyncio.gather(*[tb.call("search", {"query": "same"}) for _ in range(8)])
    assert all(r.ok for r in res) and tb.stats["paid_calls"] == 1 and len(web.log) == 1


def _writer(path, world, wid, n, q):
    async def go():
        tb = Toolbox(OfflineProvider(world), cache=ToolCache(path))
        for i in range(n):
            await tb.call("search", {"query": f"term{i % 25} Valdoria"})
            await tb.call("visit", {"url": f"https://wiki.example.org/Valdoria?{wid}-{i}"})
        q.put(dict(tb.stats))
    asyncio.run(go())


def test_several_processes_write_at_once(world, tmp_path):
    path = tmp_path / "shared.sqlite"
    ToolCache(path)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=_writer, args=(str(path), str(world), w, 40, q)) for w in range(3)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(120)
        assert p.exitcode == 0
    rows = sqlite3.connect(path).execute("SELECT tool, COUNT(*) FROM tool_cache GROUP BY tool").fetchall()
    assert dict(rows) == {"search": 25, "visit": 120}  # shared keys once, distinct keys all kept


def test_an_offline_world_image_name_that_leads_out_is_refused_naming_the_line(tmp_path):
    from agent.tools.offline import OfflineProvider, WorldError

    (tmp_path / "images").mkdir()
    (tmp_path / "outside.png").write_bytes(b"\x89PNG not really")
    (tmp_path / "pages.jsonl").write_text(json.dumps({"url": "u", "title": "t", "text": "x",
                                                      "images": ["../outside.png"]}) + "\n")
    with pytest.raises(WorldError, match=r"pages.jsonl:1: image: '\.\./outside.png' leads outside"):
        OfflineProvider(tmp_path)
