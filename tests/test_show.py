"""agent.show: the terminal views, the self-contained HTML page, and the page as a browser renders it.

The browser test drives headless Chromium (Debian's ``chromium``; ``.ci/run`` installs it) on the file://
page with a deep link that opens one call, reads the rendered DOM and saves a screenshot.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from agent import judge, show
from agent import run as runner
from agent.rundir import RunError, load_run, token_key
from agent.rundir.lines import seal
from agent.show import html as show_html
from probes import entropy
from tests.guards import HANG_GUARD_S


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """Three scripted ReAct trajectories, judged, with the teacher-forced entropy probe (per-token ΔH / KL)."""
    out = tmp_path_factory.mktemp("show") / "run"
    assert runner.main(["--method", "react", "--benchmark", "demo", "--backend", "scripted", "--limit", "3",
                        "--out", str(out), "--no-progress"]) == 0
    assert judge.main([str(out), "--judge", "exact", "--no-progress"]) == 0
    assert entropy.main([str(out), "--mode", "teacher-forced", "--backend", "scripted", "--no-progress"]) == 0
    from probes import grounding, removal

    assert grounding.main([str(out), "--judge", "scripted", "--no-progress"]) == 0
    assert removal.main([str(out), "--steps", "1..3", "--backend", "scripted", "--judge", "exact", "--no-progress"]) == 0
    return out


def test_sample_list_and_trajectory_in_the_terminal(demo_run, capsys):
    assert show.main([str(demo_run)]) == 0
    listing = capsys.readouterr().out
    run = load_run(demo_run)
    for ln in run.lines:
        assert re.search(rf"^\s*{ln.sample_id}\s+0\s+demo\s+ok\s+{ln.n_calls}\b", listing, re.M), listing
    assert listing.count("CORRECT") == 3 and "judge: exact" in listing

    line = next(ln for ln in run.lines if ln.sample_id == "demo_3")
    assert show.main([str(demo_run), "demo_3"]) == 0
    text = capsys.readouterr().out
    q = line.query_images["<image_0>"]
    assert f"image_0>={q[:12]}" in text                       # the query image by hash
    assert re.search(r"^#1/20 react\s+images 1 \(query 1: " + q[:8], text, re.M)
    assert "-> lens_search(" in text and "result images" in text  # the tool call and its observation
    assert f"ANSWER: {line.answer}" in text
    assert "grade CORRECT (exact)" in text
    # reasoning is collapsed to its first line unless asked for
    r = next(ev.reasoning for ev in line.events if ev.type == "llm_call")
    assert show.main([str(demo_run), "demo_3", "--reasoning"]) == 0
    assert r.strip() in capsys.readouterr().out

    assert show.main([str(demo_run), "demo_3", "--trial", "5"]) == 2
    assert "no trajectory demo_3 trial 5" in capsys.readouterr().err


def test_call_messages_accepts_an_index_or_the_event(demo_run):
    run = load_run(demo_run)
    line = run.lines[0]
    ev = next(e for e in line.events if e.type == "llm_call" and e.index == 2)
    assert run.call_messages(line, 2) == run.call_messages(line, ev)
    assert run.call_messages(line, 2)[-1].role in ("user", "tool")
    with pytest.raises(RunError, match="no LLM call #99"):
        run.call_messages(line, 99)


def _page_of(out, ln) -> str:
    return (show.files_dir(out) / (token_key(ln.sample_id, ln.trial) + ".html")).read_text()


def test_html_is_self_contained(demo_run, tmp_path):
    info = show.build_html(demo_run, tmp_path / "run.html")
    index = (tmp_path / "run.html").read_text()
    assert info["samples"] == 3 and info["missing_images"] == []
    run = load_run(demo_run)
    for page in [index, *(_page_of(tmp_path / "run.html", ln) for ln in run.lines)]:
        # nothing is fetched from elsewhere: no external script, stylesheet, image or font
        assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page)
        assert "<link" not in page and "@import" not in page and "fetch(" not in page
        assert "SCRIPTED FAKE BACKEND" in page            # the provenance mark travels with every page
    for ln in run.lines:                                # a trajectory's query images are embedded in its page, once
        page = _page_of(tmp_path / "run.html", ln)
        for sha in ln.query_images.values():
            assert page.count(f'"{sha}": "data:image/') == 1


def _details(page: str) -> dict:
    import base64
    import gzip
    import json

    blob = re.search(r'<script type="application/json" id="details">(.*?)</script>', page, re.S).group(1)
    return {k: json.loads(gzip.decompress(base64.b64decode(v))) for k, v in json.loads(blob).items()}


def test_html_token_columns_carry_the_probe(demo_run, tmp_path):
    """The think tokens are embedded as columns: H of each token, and the teacher-forced ΔH / KL per token."""
    import numpy as np

    from analysis.estimators.entropy import entropy_bounds, grouped_tail_entropy

    show.build_html(demo_run, tmp_path / "a.html", tokens="all")
    run = load_run(demo_run)
    line = next(ln for ln in run.lines if ln.sample_id == "demo_3")
    d = _details(_page_of(tmp_path / "a.html", line))["demo_3__t0"]
    tok = run.tokens(line)
    for call in (1, 5):
        col = d["tokens"][str(call)]
        sel = (tok["call"] == call) & tok["think"].astype(bool)
        assert "".join(col["text"]) == "".join(tok["text"][sel])
        assert col["H"] == np.rint(grouped_tail_entropy(tok["top_logprobs"][sel]) * 100).astype(int).tolist()
        assert len(col["dH"]) == len(col["kl"]) == int(sel.sum())
        # the hover's exact-entropy bound over the vocabulary the run's header records (the scripted model's)
        assert col["Hhi"] == np.rint(entropy_bounds(tok["top_logprobs"][sel], 248_320)[1] * 100).astype(int).tolist()
    assert run.header.backend.vocab_size == 248_320
    # demo_3 is planted with two grounding steps: the images lower the entropy at step 1, raise it at step 5
    assert all(v < 0 for v in d["tokens"]["1"]["dH"]) and all(v > 0 for v in d["tokens"]["5"]["dH"])
    assert all(v > 0 for v in d["tokens"]["1"]["kl"])

    info = show.build_html(demo_run, tmp_path / "n.html", tokens="none")
    assert all(_details(_page_of(tmp_path / "n.html", ln))["demo_3__t0" if ln is line else
                                                         f"{ln.sample_id}__t0"]["tokens"] == {} for ln in run.lines)
    assert info["largest_page_bytes"] < show.build_html(demo_run, tmp_path / "a.html", tokens="all")["largest_page_bytes"]


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _headless(browser, profile, *args):
    return [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-quic", f"--user-data-dir={profile}", "--virtual-time-budget=8000",
            "--window-size=1400,900", *args]


@pytest.mark.skipif(_chromium() is None, reason="needs chromium (.ci/run installs Debian's package)")
def test_page_renders_in_a_browser(demo_run, tmp_path):
    browser = _chromium()
    html = tmp_path / "run.html"
    show.build_html(demo_run, html)
    run = load_run(demo_run)
    line = next(ln for ln in run.lines if ln.sample_id == "demo_3")
    url = f"{html.resolve().as_uri()}#sample=demo_3__t0&open=2&show=messages,reasoning,tool&colour=dH"

    dom = subprocess.run(_headless(browser, tmp_path / "profile", "--dump-dom", url),
                         capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = re.sub(r"<script.*?</script>", "", dom.stdout, flags=re.S)  # the rendered elements only
    assert 'data-ready="1"' in page, "the page's script did not finish"
    # the index's link went to demo_3's own page, which lists only it, with the way back and to its neighbours
    rows = re.findall(r'<tr class="sample-row[^"]*" data-key="([^"]+)"', page)
    assert rows == ["demo_3__t0"] and '<a href="../run.html">↑ all trajectories</a>' in page and "‹ previous" in page
    # the deep link opened demo_3's second call: its messages show the thumbnails of exactly what it saw
    m = re.search(r'<details class="call" data-index="2" open="">(.*?)</details><details class="call"', page, re.S)
    assert m, "call 2 is not open"
    call = m.group(1)
    ev = run.call_event(line, 2)
    thumbs = re.findall(r'<img class="thumb"[^>]*title="sha256 ([0-9a-f]{64})"', call)
    assert thumbs and set(thumbs) == set(ev.image_hashes)
    assert all(src.startswith("data:image/") for src in re.findall(r'<img class="thumb"[^>]*src="([^"]+)"', call))
    # the reasoning is coloured token by token (ΔH from the teacher-forced probe), with a legend
    titles = re.findall(r'<span class="tok" title="(H=[0-9.]+ ΔH=-?[0-9.]+ KL=[0-9.]+[^"]*)"', call)
    assert len(titles) == ev.think_tokens
    # on hover: the bounds on the token's exact entropy and its top-5 alternatives under both contexts
    for t in titles:
        lo, hi = map(float, re.search(r"exact H in \[([0-9.]+), ([0-9.]+)\]", t).groups())
        assert lo <= hi and t.startswith(f"H={lo:.2f}")
        w = re.search(r"with images: (.*)\nwithout: (.*)$", t, re.S)
        assert w, t
        for side in w.groups():
            alts = re.findall(r'(&quot;.*?&quot;|".*?") ([0-9.]+)%', side)
            assert 1 <= len(alts) <= 5 and all(0 <= float(p) <= 100 for _, p in alts)
            ps = [float(p) for _, p in alts]
            assert ps == sorted(ps, reverse=True)  # best first
    assert "blue: the images lower it" in page
    assert re.search(r"lens_search\(.*\) ok", call)

    # the probes' findings per step: the annotator's label (with its reason) and the step-k replay's outcome
    labels = {st["step"]: st for st in next(json.loads(x) for x in (demo_run / "probes" / "grounding" / "labels.jsonl")
                                            .read_text().splitlines() if '"demo_3"' in x)["steps"]}
    assert f'>{labels[2]["category"]}</span>' in call and f"grounding (annotator): <b>{labels[2]['category']}</b>" in call
    import csv

    with open(demo_run / "probes" / "removal" / "outcomes.csv") as f:
        k2 = next(r for r in csv.DictReader(f) if r["sample_id"] == "demo_3" and r["k"] == "2")
    verdict = "correct" if k2["replay_correct"] == "True" else "wrong"
    assert re.search(rf"images removed from this step on \(k=2\): <span class=\"g-[A-Z]+\">{verdict}</span>", call)
    assert '<table class="removal-table"><tbody><tr><th>step-k removal</th><th>k=1</th><th>k=2</th><th>k=3</th>' in page

    # no sample picked: the landing pane summarises the run instead of "Select a sample"
    dom = subprocess.run(_headless(browser, tmp_path / "profile", "--dump-dom", html.resolve().as_uri()),
                         capture_output=True, text=True, timeout=HANG_GUARD_S)
    land = re.sub(r"<script.*?</script>", "", dom.stdout, flags=re.S)
    m = re.search(r'<div id="landing">(.*?)</div>', land, re.S)
    assert m, land[-3000:]
    rows = re.findall(r'<tr class="sample-row[^"]*" data-key="([^"]+)"', land)  # the index lists every sample
    assert sorted(rows) == sorted(f"{ln.sample_id}__t0" for ln in run.lines)
    pane = m.group(1)
    n = len(run.lines)
    assert f"{n} (1 trial(s)); statuses: " in pane and "accuracy (exact-match" in pane and "graded)" in pane
    assert f"{sum(ln.n_calls for ln in run.lines)} (" in pane
    for probe in ("entropy-teacher-forced", "grounding: 3 trajectories annotated", "removal: 9 replays"):
        assert probe in pane, probe

    shot = tmp_path / "show.png"
    r = subprocess.run(_headless(browser, tmp_path / "profile", f"--screenshot={shot}", url),
                       capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert r.returncode == 0 and shot.exists() and shot.stat().st_size > 20_000, r.stderr[-2000:]
    print(f"screenshot: {shot}")


def _samples(page: str) -> list:
    return json.loads(re.search(r'<script type="application/json" id="samples">(.*?)</script>', page, re.S).group(1))


def test_one_page_per_trajectory_none_listing_the_others(demo_run, tmp_path, monkeypatch):
    """Each trajectory's page holds its own details and images only, and lists no other trajectory; the index holds
    no trajectory at all (its list is read from chunk files); a rewrite of fewer trajectories removes stale pages."""
    monkeypatch.setattr(show_html, "LIST_CHUNK", 2)
    out = tmp_path / "run.html"
    info = show.build_html(demo_run, out)
    run = load_run(demo_run)
    fdir = show.files_dir(out)
    assert sorted(p.name for p in fdir.glob("list-*.js")) == ["list-0.js", "list-1.js"]
    listed = [r["key"] for f in sorted(fdir.glob("list-*.js"))
              for r in json.loads(re.fullmatch(r"MMCF_LIST\((.*)\);\n", f.read_text(), re.S).group(1))]
    assert sorted(listed) == sorted(f"{ln.sample_id}__t{ln.trial}" for ln in run.lines)
    index = out.read_text()
    assert _samples(index) == [] and _details(index) == {} and "data:image/" not in index
    for ln in run.lines:
        page, key = _page_of(out, ln), f"{ln.sample_id}__t{ln.trial}"
        assert [r["key"] for r in _samples(page)] == [key] and list(_details(page)) == [key]
        for other in run.lines:  # a query image only in its own trajectory's page
            sha = next(iter(other.query_images.values()))
            assert (f'"{sha}": "data:image/' in page) == (other is ln or sha in ln.query_images.values())
    assert info["largest_page_bytes"] == max(p.stat().st_size for p in fdir.glob("*.html"))
    small = show.build_html(demo_run, out, limit=1)
    assert len(list(fdir.glob("*.html"))) == 1 and sorted(p.name for p in fdir.glob("list-*.js")) == ["list-0.js"]
    assert abs(small["index_bytes"] - info["index_bytes"]) < 200  # the index does not grow with the trajectories


@pytest.mark.skipif(_chromium() is None, reason="needs chromium (.ci/run installs Debian's package)")
def test_the_index_pages_and_searches_in_a_browser(demo_run, tmp_path, monkeypatch):
    """Two rows a page: page 2 shows the third trajectory; a search sees every trajectory (all chunks read)."""
    monkeypatch.setattr(show_html, "LIST_CHUNK", 2)
    monkeypatch.setattr(show_html, "INDEX_ROWS", 2)
    browser = _chromium()
    out = tmp_path / "run.html"
    show.build_html(demo_run, out)
    keys = sorted(f"{ln.sample_id}__t{ln.trial}" for ln in load_run(demo_run).index)

    def rows(hash_):
        dom = subprocess.run(_headless(browser, tmp_path / "profile", "--dump-dom", f"{out.resolve().as_uri()}#{hash_}"),
                             capture_output=True, text=True, timeout=HANG_GUARD_S)
        assert dom.returncode == 0, dom.stderr[-2000:]
        page = re.sub(r"<script.*?</script>", "", dom.stdout, flags=re.S)
        assert 'data-ready="1"' in page
        return re.findall(r'<tr class="sample-row[^"]*" data-key="([^"]+)"', page), page

    got, page = rows("page=1")
    assert got == keys[:2] and "page <b>1</b> of 2" in page and "next ›" in page
    got, page = rows("page=2")
    assert got == keys[2:] and "page <b>2</b> of 2" in page and "‹ prev" in page
    got, page = rows(f"q={keys[2].split('__')[0]}")   # the third trajectory's id: in the second chunk
    assert got == keys[2:] and "1 trajectories match" in page


def test_large_images_are_embedded_downscaled(tmp_path):
    """An image over EMBED_PX on a side goes into the page as a smaller JPEG (the original stays in the run);
    a small one is embedded as stored, byte for byte."""
    import base64
    import io
    from types import SimpleNamespace

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    paths = {}
    for name, side in (("big", 2000), ("small", 300)):
        paths[name] = p = tmp_path / f"{name}.jpg"
        Image.fromarray(rng.integers(0, 255, (side, side * 3 // 4, 3), dtype=np.uint8)).save(p, quality=90)
    run = SimpleNamespace(image_path=lambda sha: paths.get(sha))  # what _image_uri reads of a run
    cache, missing = {}, []
    big = show_html._image_uri(run, "big", cache, missing)
    small = show_html._image_uri(run, "small", cache, missing)
    assert show_html._image_uri(run, "gone", cache, missing) is None and missing == ["gone"]
    im = Image.open(io.BytesIO(base64.b64decode(big.split(",", 1)[1])))
    assert max(im.size) == show_html.EMBED_PX and im.size[0] < im.size[1] and big.startswith("data:image/jpeg;base64,")
    assert len(big) < paths["big"].stat().st_size / 4
    assert base64.b64decode(small.split(",", 1)[1]) == paths["small"].read_bytes()


@pytest.mark.skipif(_chromium() is None, reason="needs chromium (.ci/run installs Debian's package)")
def test_text_that_looks_like_html_renders_as_text_and_every_row_shows(demo_run, tmp_path):
    """V1: an answer holding ``<!--<script>`` (and a label naming a placeholder of the page) is shown as text."""
    run_dir = tmp_path / "run"
    shutil.copytree(demo_run, run_dir)
    hostile = "<!--<script>document.title='pwned'</script> __SAMPLES__ &amp;"
    res = run_dir / "results.jsonl"
    lines = [json.loads(x) for x in res.read_text().splitlines()]
    lines[0]["answer"] = hostile
    res.write_bytes(b"".join(seal(ln) + b"\n" for ln in lines))  # a crafted run: sealed again
    (run_dir / "results.index.jsonl").unlink(missing_ok=True)
    html = tmp_path / "run.html"
    show.build_html(run_dir, html)
    dom = subprocess.run(_headless(_chromium(), tmp_path / "profile", "--dump-dom", html.resolve().as_uri()),
                         capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = re.sub(r"<script.*?</script>", "", dom.stdout, flags=re.S)
    assert 'data-ready="1"' in page and "pwned" not in re.search(r"<title>(.*?)</title>", dom.stdout, re.S).group(1)
    rows = re.findall(r'<tr class="sample-row[^"]*" data-key="([^"]+)"', page)
    assert len(rows) == len(lines)
    assert "&lt;!--&lt;script&gt;document.title='pwned'&lt;/script&gt; __SAMPLES__ &amp;amp;" in page


def test_the_viewer_reads_past_a_judge_file_whose_last_line_a_kill_cut_mid_character(demo_run, tmp_path, capsys):
    """A judge killed mid-write can leave a last line cut inside a multi-byte character: the terminal view and the
    HTML pages read the intact grades through the one reader of stored grades (issue 56), never a
    UnicodeDecodeError."""
    run_dir = tmp_path / "run"
    shutil.copytree(demo_run, run_dir)
    grades = run_dir / "judge-exact.jsonl"
    intact = len(grades.read_bytes().splitlines())
    with open(grades, "ab") as f:
        f.write('{"sample_id": "demo_1", "trial": 0, "reason": "caf\u00e9'.encode()[:-1])  # cut inside "é"
    assert show.main([str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert out.count("CORRECT") + out.count("INCORRECT") >= intact
    assert show.main([str(run_dir), "--html", str(tmp_path / "p.html")]) == 0
    assert (tmp_path / "p.html").exists()
