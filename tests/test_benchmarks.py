"""Benchmark loader, stats CLI and subset policy on the shared samples, real manifests and broken files."""
import json
from collections import Counter

from agent.benchmarks import PAPER_CATEGORY, load_benchmark, load_dataset_dir, main, paper_subset


def test_shared_samples_load(shared_dir):
    ms = load_dataset_dir(shared_dir / "samples", check_images=False)
    assert set(ms) == {"browsecomp_vl", "livevqa", "mmsearch", "mmsearch_plus", "simplevqa", "vdr_bench", "world_vqa"}
    live = ms["livevqa"].samples[0]
    assert live.options and "Options:" in live.question and "A. Air Force One" in live.question
    assert ms["simplevqa"].category == "Atomic factuality"


def test_stats_json_on_real_manifests(shared_dir, capsys):
    rc = main(["stats", str(shared_dir / "data/mmcf_manifests"), "--json", "--no-image-check"])
    rep = json.loads(capsys.readouterr().out)
    assert rc == 0 and rep["total"] == 1725  # 1,727 rows, two duplicate ids counted once
    mm = rep["benchmarks"]["mmsearch"]
    assert mm["samples"] == 169 and [p["kind"] for p in mm["problems"]] == ["duplicate_id", "duplicate_id"]
    assert all(p["line"] > 0 for p in mm["problems"])
    assert rep["benchmarks"]["mmsearch_plus"]["images_per_sample"]["2"] > 0
    kinds = Counter(p["kind"] for p in rep["benchmarks"]["simplevqa"]["problems"])
    assert kinds["category_json_list"] > 0
    assert {b["category"] for b in rep["benchmarks"].values()} == {
        "Atomic factuality", "Dynamic information-seeking", "Visual deep research"}
    assert main(["stats", str(shared_dir / "data/mmcf_manifests"), "--strict", "--no-image-check"]) == 1


def test_broken_file_keeps_valid_rows(tmp_path):
    d = tmp_path / "toy"
    (d / "imgs").mkdir(parents=True)
    (d / "imgs" / "a.jpg").write_bytes(b"x")
    rows = [
        {"id": "1", "query": "q1", "query_images": ["a.jpg"], "answer": "A", "category": '["ocr", "math"]'},
        {"id": "1", "query": "dup", "query_images": ["a.jpg"], "answer": "B"},
        {"id": "2", "query": "q2", "query_images": ["missing.jpg"], "answer": ""},
    ]
    text = "\n".join(json.dumps(r) for r in rows) + '\n{"id": "3", "query": "torn'
    (d / "data_unified.jsonl").write_text(text)
    m = load_benchmark(d)
    assert [s.id for s in m.samples] == ["1", "2"] and m.samples[0].category == "ocr / math"
    kinds = [(p.line, p.kind) for p in m.problems]
    assert (1, "category_json_list") in kinds and (2, "duplicate_id") in kinds
    assert (3, "empty_answer") in kinds and (3, "missing_image") in kinds and (4, "torn_line") in kinds


def test_missing_manifest_is_clear(tmp_path, capsys):
    assert main(["stats", str(tmp_path / "nope")]) == 2
    assert "nope" in capsys.readouterr().err


def test_paper_subsets_are_deterministic(shared_dir):
    root = shared_dir / "data/mmcf_manifests"
    bc = load_benchmark(root / "browsecomp_vl", check_images=False)
    sub = paper_subset(bc, seed=1)
    lv = Counter(s.extra["level"] for s in sub)
    assert lv["level2"] == sum(1 for s in bc.samples if s.extra["level"] == "level2") and lv["level1"] == 100
    wv = load_benchmark(root / "world_vqa", check_images=False)
    a, b = paper_subset(wv, seed=3, n=50), paper_subset(wv, seed=3, n=50)
    assert [s.id for s in a] == [s.id for s in b] and len(a) == 50
    assert [s.id for s in paper_subset(wv, seed=4, n=50)] != [s.id for s in a]
    full, part = Counter(s.category for s in wv.samples), Counter(s.category for s in a)
    for c in full:  # proportional within one
        assert abs(part[c] - 50 * full[c] / len(wv.samples)) <= 1
    vdr = load_benchmark(root / "vdr_bench", check_images=False)
    tiers = Counter(s.id.split("_")[0] for s in paper_subset(vdr, seed=0, n=60))
    assert set(tiers) == set(Counter(s.id.split("_")[0] for s in vdr.samples))


def test_demo_benchmark_points_at_the_world(tmp_path, monkeypatch):
    monkeypatch.setenv("MMCF_DEMO_DIR", str(tmp_path / "demo-data"))
    from agent.benchmarks import resolve_benchmark

    m = resolve_benchmark("demo")
    assert len(m.samples) >= 5 and not m.problems
    assert all(p.exists() for s in m.samples for p in s.image_paths)
    assert PAPER_CATEGORY["demo"] and max(len(s.query_images) for s in m.samples) == 2


def test_an_answer_or_options_of_the_wrong_type_are_refused_naming_the_line(tmp_path):
    """Values that would make nonsense: a list answer (graded as its Python repr), options given as one string
    ("ABCD" would read as four one-letter options), a boolean answer: the row is skipped with its problem named."""
    import json

    d = tmp_path / "simplevqa"
    (d / "imgs").mkdir(parents=True)
    rows = [{"id": "ok", "query": "q?", "query_images": ["a.png"], "answer": 1911},
            {"id": "list", "query": "q?", "query_images": ["a.png"], "answer": ["Paris", "Lyon"]},
            {"id": "str_opts", "query": "q?", "query_images": ["a.png"], "answer": "A", "options": "ABCD"},
            {"id": "bool", "query": "q?", "query_images": ["a.png"], "answer": True}]
    (d / "data_unified.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    m = load_benchmark(d, check_images=False)
    assert [s.id for s in m.samples] == ["ok"] and m.samples[0].answer == "1911"
    bad = {p.id: p for p in m.problems if p.kind == "bad_field"}
    assert set(bad) == {"list", "str_opts", "bool"}
    assert bad["list"].line == 2 and "answer is list" in bad["list"].detail
    assert "options is str 'ABCD'" in bad["str_opts"].detail


def _hle(tmp_path, n, *, bad=()):
    """An HLE-VL file laid out as WebWatcher's evaluation reads it (infer/scripts_eval/agent_eval.py: ``prompt``,
    ``file_path`` naming the image; infer/evaluation/evaluate_hle_official.py: ``answers``), no ids."""
    d = tmp_path / "data" / "hle_vl"
    (d / "imgs").mkdir(parents=True)
    from PIL import Image

    Image.new("RGB", (8, 8), (9, 9, 9)).save(d / "imgs" / "a.png")
    rows = [{"prompt": f"Q{i}?", "file_path": "/mnt/eval/hle/images/" + ("missing.png" if i in bad else "a.png"),
             "answers": ["42"]} for i in range(n)]
    (d / "data_unified.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def test_webwatcher_s_hle_vl_rows_map_to_the_unified_layout(tmp_path):
    m = load_benchmark(_hle(tmp_path, 3))
    s = m.samples[1]
    assert (s.query, s.query_images, s.answer) == ("Q1?", ["a.png"], "42")  # the file name, in imgs/; answers[0]
    assert s.id.startswith("hle_") and len({x.id for x in m.samples}) == 3 and not m.problems
    # the id comes from the row's content: the same in a copy with the rows in another order
    d2 = tmp_path / "copy"
    (d2 / "data" / "hle_vl").mkdir(parents=True)
    (d2 / "data" / "hle_vl" / "imgs").symlink_to(m.path.parent / "imgs")
    lines = m.path.read_text().splitlines()
    (d2 / "data" / "hle_vl" / "data_unified.jsonl").write_text("\n".join(reversed(lines)) + "\n")
    assert {x.id for x in load_benchmark(d2 / "data" / "hle_vl").samples} == {x.id for x in m.samples}


def test_hle_vl_must_be_the_whole_330_question_visual_subset(tmp_path, capsys):
    """Paper D.1: WebWatcher's released 330-question visual subset; every row's image inside imgs/."""
    from agent.benchmarks import HLE_VL_VISUAL, incomplete_subset
    from agent.run import main as run_main

    assert incomplete_subset(load_benchmark(_hle(tmp_path / "ok", HLE_VL_VISUAL))) is None
    why = incomplete_subset(load_benchmark(_hle(tmp_path / "bad", HLE_VL_VISUAL, bad={7, 9})))
    assert "this file gives 330 questions, 328 with every image inside" in why and "missing.png not found" in why
    small = _hle(tmp_path / "small", 12)
    assert "this file gives 12 questions, 12 with every image inside" in incomplete_subset(load_benchmark(small))
    assert main(["stats", str(small.parent)]) == 1 and "INCOMPLETE: " in capsys.readouterr().out
    # a run on it is refused before anything is written
    out = tmp_path / "run"
    assert run_main(["--method", "direct", "--backend", "scripted", "--benchmark", str(small), "--out", str(out),
                     "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "HLE-VL (paper D.1) is WebWatcher's 330-question visual subset" in err
    assert not (out / "header.json").exists() and not (out / "results.jsonl").exists()


def test_stats_on_a_missing_or_empty_directory_names_the_expected_layout_and_where_to_read(tmp_path, capsys):
    from agent.benchmarks.cli import main as bench_main

    (tmp_path / "empty" / "mmsearch").mkdir(parents=True)
    for d in ("nope", "empty"):
        assert bench_main(["stats", str(tmp_path / d)]) == 2
        err = capsys.readouterr().err
        assert f"{tmp_path / d}/<benchmark>/data_unified.jsonl" in err and "The benchmark data" in err
        assert "Traceback" not in err


def test_a_manifest_with_rows_that_cannot_run_is_refused_unless_the_user_opts_in(tmp_path, capsys):
    """A row left out changes the paper's denominators, as a missing image does (issue 82): refused before any work,
    naming the row and the opt-in; with --skip-bad-rows the others run and the header records what was left out."""
    from PIL import Image

    from agent.run import main as run_main
    from agent.rundir import load_run

    d = tmp_path / "data" / "mini"
    (d / "imgs").mkdir(parents=True)
    Image.new("RGB", (8, 8), (9, 9, 9)).save(d / "imgs" / "a.png")
    rows = [json.dumps({"id": f"q{i}", "query": f"Q{i}?", "query_images": ["a.png"], "answer": "42"}) for i in range(3)]
    # the last row cut short by a kill
    (d / "data_unified.jsonl").write_text("\n".join(rows) + '\n{"id": "q3", "query": "Q3?", "query_ima\n')
    base = ["--method", "direct", "--backend", "scripted", "--benchmark", str(d), "--no-progress"]
    assert run_main([*base, "--out", str(tmp_path / "r1")]) == 2
    err = capsys.readouterr().err
    assert "1 row(s) cannot be run {'torn_line': 1}" in err and "--skip-bad-rows" in err
    assert not (tmp_path / "r1" / "results.jsonl").exists()
    assert run_main([*base, "--skip-bad-rows", "--out", str(tmp_path / "r2")]) == 0
    run = load_run(tmp_path / "r2")
    assert len(run.index) == 3 and run.header.manifest_problems == {"torn_line": 1}
