"""The paper's protocol as published numbers need it (issue 20): independent trials, one served model per run,
calls cut by length counted, B_max in the branch prompt, the B_max-sweep selection, Table 1's n, one judge id."""
from __future__ import annotations

import json

import pytest

from agent.run import SERVED_MAX_TOKENS
from agent.run import main as run_main
from agent.rundir import RunDir, load_run
from serving.fakes.policy import agent_policy
from serving.fakes.sglang_server import FakeSGLang
from tests.records import recorded_lines


def _cli(url, out, *extra):
    return ["--method", "react", "--backend", "openai", "--endpoint", url, "--benchmark", "demo", "--t-max", "6",
            "--out", str(out), "--no-progress", *extra]


def _seeds(srv) -> list:
    return [b.get("seed") for b in srv.bodies if "messages" in b]


def test_each_trial_samples_with_its_own_recorded_seed(tmp_path):
    """SGLang with deterministic inference seeds every unseeded request with 42: trials would be one trial x3."""
    with FakeSGLang(reply=agent_policy, deterministic=True) as srv:
        assert run_main(_cli(srv.url, tmp_path / "r", "--limit", "2", "--trials", "3")) == 0
        header = RunDir(tmp_path / "r").read_header()
        base = header["sampling"]["seed"]
        assert isinstance(base, int) and header["seed_source"] == "drawn"
        seeds = _seeds(srv)
        assert set(seeds) == {base, base + 1, base + 2}  # one per trial, every request carries it
        by_trial = {}
        for ln in recorded_lines(tmp_path / "r"):
            ev = next(e for e in ln["events"] if e["type"] == "llm_call")
            by_trial.setdefault(ln["trial"], set()).add(ev["sampling"]["seed"])
        assert by_trial == {0: {base}, 1: {base + 1}, 2: {base + 2}}  # and each call records its seed
        # a resume reuses the recorded seeds (no new draw, no header clash)
        n = len(srv.bodies)
        assert run_main(_cli(srv.url, tmp_path / "r", "--limit", "3", "--trials", "3")) == 0
        assert set(_seeds(srv)[n:]) <= {base, base + 1, base + 2}
        assert RunDir(tmp_path / "r").read_header()["sampling"]["seed"] == base
        # a given --seed is recorded as given
        assert run_main(_cli(srv.url, tmp_path / "g", "--limit", "1", "--seed", "7")) == 0
        assert RunDir(tmp_path / "g").read_header()["seed_source"] == "given"


def test_a_run_recorded_without_a_seed_on_a_deterministic_server_is_refused(tmp_path, capsys):
    with FakeSGLang(reply=agent_policy, deterministic=True) as srv:
        assert run_main(_cli(srv.url, tmp_path / "r", "--limit", "1", "--trials", "2")) == 0
        rd = RunDir(tmp_path / "r")
        h = rd.read_header()
        h["sampling"]["seed"] = None  # a run recorded without a seed
        h.pop("seed_source")
        rd.header_path.write_text(json.dumps(h))
        n = len(srv.bodies)
        assert run_main(_cli(srv.url, tmp_path / "r", "--limit", "2", "--trials", "2")) == 2
        assert len(srv.bodies) == n  # refused before any work
    assert "one trial repeated" in capsys.readouterr().err


def test_a_reply_from_another_model_ends_the_unit_and_the_run_says_so(tmp_path, capsys):
    with FakeSGLang(reply=agent_policy) as srv:
        calls = {"n": 0}

        def policy(req):
            calls["n"] += 1
            if calls["n"] == 3:  # a router starts sending part of the traffic to another deployment
                srv.model_name = "other-model"
            return agent_policy(req)

        srv.reply = policy
        rc = run_main(_cli(srv.url, tmp_path / "r", "--limit", "3", "--concurrency", "1"))
    err = capsys.readouterr().err
    lines = recorded_lines(tmp_path / "r")
    changed = [ln for ln in lines if ln["status"] == "error"]
    assert rc == 3 and changed and all("ServedModelChanged" in ln["error"] and "other-model" in ln["error"] for ln in changed)
    assert "because the served model changed" in err and "named another model" in err
    # nothing from the other model is kept as a finished trajectory
    assert all(ln["model"] == "fake-qwen3.5" for ln in lines if ln["status"] == "ok")


def test_served_models_get_the_release_generation_length_and_length_cuts_are_counted(tmp_path, capsys):
    with FakeSGLang(reply=agent_policy) as srv:
        assert run_main(_cli(srv.url, tmp_path / "full", "--limit", "1")) == 0
        assert {b["max_tokens"] for b in srv.bodies if "messages" in b} == {SERVED_MAX_TOKENS} == {8192}
        capsys.readouterr()
        rc = run_main(_cli(srv.url, tmp_path / "cut", "--limit", "2", "--max-tokens", "6"))
    err = capsys.readouterr().err
    lines = recorded_lines(tmp_path / "cut")
    cut = sum(c["finish_reason"] == "length" for ln in lines for c in ln["calls"])
    assert rc in (0, 3) and cut > 0
    assert f"{cut} of " in err and "ended by length (max_tokens 6; step 1:" in err
    from analysis.tables import table4

    t4 = table4([tmp_path / "cut"])
    total = sum(ln["n_calls"] for ln in lines if ln["status"] in ("ok", "no_answer"))
    kept = sum(c["finish_reason"] == "length" for ln in lines if ln["status"] in ("ok", "no_answer") for c in ln["calls"])
    assert t4["ended by length (% of calls)"].iloc[0] == pytest.approx(100 * kept / total)


# ------------------------------------------------------------------ Table 1: independent trials, n, one judge
def _direct(tmp_path, name, replies, **kw):
    import asyncio

    from agent.backends.scripted import ScriptedBackend
    from agent.judge import judge_run
    from agent.run import RunConfig, run

    out = tmp_path / name
    asyncio.run(run(RunConfig(method="direct", out=str(out), progress=False, **kw), [],
                    backends=[ScriptedBackend(list(replies))]))
    asyncio.run(judge_run(out, judge="exact", progress=False))
    return out


def test_std_over_identical_trials_is_refused_and_over_differing_ones_given(tmp_path):
    from analysis.tables import table1

    same = _direct(tmp_path, "same", ["<answer>1911</answer>"] * 12, limit=3, trials=2)
    t = table1([same])
    assert t.iloc[0]["Avg."].endswith("± —") and "std refused" in t.attrs["note"] and "identical" in t.attrs["note"]
    assert t.attrs["numeric"].query("benchmark == 'Avg.'").iloc[0]["std_refused"]
    # the second trial answers differently for one sample: a real std (and no refusal)
    differ = _direct(tmp_path, "differ", ["<answer>1911</answer>"] * 3 + ["<answer>nope</answer>"]
                     + ["<answer>1911</answer>"] * 2, limit=3, trials=2)
    t = table1([differ])
    assert "std refused" not in t.attrs["note"]
    num = t.attrs["numeric"].query("benchmark == 'Avg.'").iloc[0]
    assert num["std"] == pytest.approx(23.57, abs=0.01)  # per trial 33.3 and 0.0 %, ddof = 1


def test_a_cell_evaluated_on_another_set_than_the_columns_n_is_marked(tmp_path):
    """Table 1's caption: n is "identical for all methods and trials"."""
    from analysis.tables import table1, write_table

    full = _direct(tmp_path, "full", ["<answer>1911</answer>"] * 6, limit=6)
    part = tmp_path / "part"
    import asyncio

    from agent.backends.scripted import ScriptedBackend
    from agent.judge import judge_run
    from agent.run import RunConfig, run

    asyncio.run(run(RunConfig(method="react", out=str(part), limit=4, t_max=2, progress=False), [],
                    backends=[ScriptedBackend(["<answer>1911</answer>"] * 4)]))
    asyncio.run(judge_run(part, judge="exact", progress=False))
    t = table1([full, part])
    assert "demo (n=6)" in t.columns
    row = t.set_index("method").loc["react"]
    assert row["demo (n=6)"].endswith("†") and not t.set_index("method").loc["direct"]["demo (n=6)"].endswith("†")
    assert "react / scripted, demo, trial 0: 4 evaluated of the column's 6" in t.attrs["note"]
    paths = write_table(t, tmp_path / "t1")
    import pandas as pd

    csv = pd.read_csv(paths[1])
    r = csv[(csv.method == "react") & (csv.benchmark == "demo")].iloc[0]
    assert r["n"] == 4 and r["n_expected"] == 6 and not r["same_set"]  # numbers, not "mean ± std" strings


def test_the_judge_records_the_model_its_replies_name_and_a_rerouted_judge_is_refused(tmp_path):
    import asyncio

    from agent.judge import judge_run
    from agent.rundir import RunError
    from analysis.tables import table1
    from tests.test_judge import _make_run, judge_reply

    rd = asyncio.run(_make_run(tmp_path, trials=1))
    with FakeSGLang(reply=judge_reply, model_name="judge-v1") as srv:
        n = {"i": 0}

        def rerouted(req):
            n["i"] += 1
            if n["i"] == 3:
                srv.model_name = "judge-v2"  # the provider routes the preview id to another model mid-run
            return judge_reply(req)

        srv.reply = rerouted
        asyncio.run(judge_run(rd, endpoint=srv.url, model="judge-v1", api_key_env=None, server="sglang", progress=False))
    recs = [json.loads(x) for x in (rd / "judge-llm.jsonl").read_text().splitlines()]
    assert {r.get("judge_served_model") for r in recs if r["reason"] == "llm"} == {"judge-v1", "judge-v2"}
    with pytest.raises(RunError, match="judge was rerouted"):
        table1([rd])


def test_one_judge_model_id_everywhere():
    from agent import cli, judge

    assert judge.DEFAULT_MODEL == cli.JUDGE_MODEL == "google/gemini-3-flash-preview"
    from tests.conftest import REPO

    readme = (REPO / "README.md").read_text()
    assert "gemini-3-flash-preview" in readme and "gemini-3-flash " not in readme and "gemini-3-flash)" not in readme


# ------------------------------------------------------------------ the B_max sweep's 700 samples (D.2)
def test_random_per_benchmark_selection_of_the_release_manifests(shared_dir, tmp_path, capsys):
    from agent.benchmarks import main as bench_main

    data = shared_dir / "data" / "mmcf_manifests"
    out = tmp_path / "sweep.json"
    assert bench_main(["subset", str(data), "--random-per-benchmark", "100", "--seed", "3", "--out", str(out)]) == 0
    sel = json.loads(out.read_text())
    assert sel["kind"] == "random-per-benchmark" and sel["seed"] == 3 and len(sel["benchmarks"]) == 7
    assert sel["total"] == 700 and all(len(set(v)) == 100 for v in sel["benchmarks"].values())
    again = tmp_path / "again.json"
    assert bench_main(["subset", str(data), "--random-per-benchmark", "100", "--seed", "3", "--out", str(again)]) == 0
    assert again.read_text() == out.read_text()  # deterministic for a seed
    other = tmp_path / "other.json"
    assert bench_main(["subset", str(data), "--random-per-benchmark", "100", "--seed", "4", "--out", str(other)]) == 0
    assert json.loads(other.read_text())["benchmarks"]["mmsearch"] != sel["benchmarks"]["mmsearch"]


def test_a_run_over_a_selection_records_it(tmp_path, capsys):
    from agent.benchmarks import main as bench_main
    from agent.tools.demo_world import ensure_demo_world

    world = ensure_demo_world()
    sel = tmp_path / "sel.json"
    assert bench_main(["subset", str(world), "--random-per-benchmark", "2", "--seed", "1", "--out", str(sel)]) == 0
    ids = json.loads(sel.read_text())["benchmarks"]["demo"]
    assert len(ids) == 2
    assert run_main(["--method", "direct", "--backend", "scripted", "--out", str(tmp_path / "r"), "--selection", str(sel),
                     "--no-progress"]) == 0
    run = load_run(tmp_path / "r")
    assert sorted(ln.sample_id for ln in run.lines) == sorted(ids)
    rec = run.header.selection.selection_file
    assert rec["kind"] == "random-per-benchmark" and rec["seed"] == 1 and len(rec["sha256"]) == 64
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"benchmarks": {"mmsearch": ["x"]}}))
    capsys.readouterr()
    assert run_main(["--method", "direct", "--backend", "scripted", "--out", str(tmp_path / "r2"), "--selection",
                     str(bad), "--no-progress"]) == 2
    assert "no selection for benchmark 'demo'" in capsys.readouterr().err


# ------------------------------------------------------------------ values no distribution has never reach a record
@pytest.mark.parametrize("body,msg", [
    ([[None, 5, "a"]], "logprob .*nan"),
    ([[float("inf"), 5, "a"]], "logprob .*inf"),
    ([[0.3, 5, "a"]], "logprob 0.3"),
    ([[-0.1, 2**40 + 7, "a"]], "token id 1099511627783 outside"),
    ([[-0.1, -5, "a"]], "token id -5 outside"),
    ([[-0.1, 700, "a"]], "token id 700 outside the vocabulary \\(0..599\\)"),
])
def test_impossible_values_are_refused_naming_the_field(body, msg):
    from agent.backends.base import BadReply
    from agent.backends.wire import tokens_from_triples

    with pytest.raises(BadReply, match=msg):
        tokens_from_triples(body, None, vocab=600, where="meta_info.output")


def test_a_short_top_list_is_refused_and_sglangs_floor_is_probability_zero():
    import numpy as np

    from agent.backends.base import LOGPROB_FLOOR, BadReply
    from agent.backends.wire import tokens_from_triples
    from analysis.estimators.entropy import grouped_tail_entropy
    from analysis.estimators.influence import kl_union_tail

    row = [[-0.1, 1, "a"], [-2.5, 2, "b"], [-3.0, 3, "c"]]
    with pytest.raises(BadReply, match="top list 0 has 2 alternatives, 3 were asked"):
        tokens_from_triples([[-0.1, 1, "a"]], [row[:2]], k=3)
    with pytest.raises(BadReply, match="top token id 2199023255552"):
        tokens_from_triples([[-0.1, 1, "a"]], [[*row[:2], [-3.0, 2**41, "z"]]], k=3)
    clamp = -3.4028234663852886e38  # SGLang: an underflowed temperature-scaled logprob, clamped to float32's lowest
    for low in (clamp, float("-inf")):
        toks = tokens_from_triples([[-0.1, 1, "a"]], [[*row[:2], [low, 3, "c"]]], k=3)
        assert toks.top_logprobs[0, 2] == LOGPROB_FLOOR
    # every entropy / KL path reads the floor as probability 0: the same as a top-2 list
    with_floor = np.array([[-0.1, -2.5, LOGPROB_FLOOR]], dtype=np.float32)
    two = np.array([[-0.1, -2.5]], dtype=np.float32)
    assert grouped_tail_entropy(with_floor)[0] == pytest.approx(grouped_tail_entropy(two)[0], abs=1e-7)
    assert np.isfinite(grouped_tail_entropy(with_floor)).all()
    kl = kl_union_tail(np.array([1, 2, 3]), np.array([-0.1, -2.5, LOGPROB_FLOOR]), np.array([1, 2, 3]),
                       np.array([-0.2, -2.0, LOGPROB_FLOOR]))
    kl2 = kl_union_tail(np.array([1, 2]), np.array([-0.1, -2.5]), np.array([1, 2]), np.array([-0.2, -2.0]))
    assert np.isfinite(kl) and kl == pytest.approx(kl2, abs=1e-6)


@pytest.mark.parametrize("fault", ["null_logprob", "positive_logprob", "huge_id", "short_top", "short_logprobs",
                                   "wrong_entry_id", "dup_top_id", "overfull_top"])
async def test_a_bad_reply_is_asked_again_then_the_unit_ends_naming_the_field(fault, tiny_model_dir):
    from agent.backends.base import BadReply, SamplingParams
    from agent.backends.sglang_native import SGLangBackend
    from agent.http import RetryPolicy

    with FakeSGLang(tokenizer_dir=str(tiny_model_dir)) as srv:
        b = SGLangBackend(srv.url, str(tiny_model_dir), policy=RetryPolicy(retries=1, backoff_s=0.01, timeout_s=60))
        msgs = [{"role": "user", "content": "hi"}]
        srv.faults = [fault]  # once: the second reply is sound and is the one kept
        out = await b.generate(msgs, SamplingParams(max_tokens=8))
        assert len(srv.bodies) == 2 and len(out.tokens) > 0 and out.tokens.top_logprobs.shape[1] == 20
        srv.faults = [fault] * 3  # every time: refused, naming the field
        with pytest.raises(BadReply, match="3 replies in a row refused; last: .*meta_info.output"):
            await b.generate(msgs, SamplingParams(max_tokens=8))
        srv.faults = ["underflow"]  # SGLang's own clamp is not a fault: kept, as the floor
        out = await b.generate(msgs, SamplingParams(max_tokens=8))
        from agent.backends.base import LOGPROB_FLOOR

        assert out.tokens.top_logprobs[0, -1] == LOGPROB_FLOOR
        await b.aclose()


# ------------------------------------------------------------------ small truths of the command line (issue 23)
def test_command_line_mistakes_get_the_right_message_and_status(tmp_path, capsys):
    from agent.preflight import main as preflight_main
    from probes.removal import parse_steps

    with pytest.raises(SystemExit) as e:
        run_main(["--methd", "react", "--out", "x"])
    assert e.value.code == 2 and "unrecognized argument: --methd (did you mean --method?)" in capsys.readouterr().err
    with pytest.raises(ValueError, match="runs backwards; write it low..high, like 1..5"):
        parse_steps("5..1")
    assert preflight_main([]) == 0 and "nothing to check" in capsys.readouterr().out
    from serving.check import main as check_main

    capsys.readouterr()
    with pytest.raises(SystemExit) as e:  # the smoke test checks one server (the probes and agent.run spread)
        check_main(["--backend", "sglang", "--endpoint", "http://a:1", "--endpoint", "http://b:1"])
    assert e.value.code == 2 and "talks to one model server" in capsys.readouterr().err


async def test_a_200_error_object_on_native_generate_is_asked_again_then_named(tiny_model_dir):
    """F5: an SGLang error object sent with status 200 is retried like a 5xx (bounded), then a clear error."""
    from agent.backends.base import BadReply, SamplingParams
    from agent.backends.sglang_native import SGLangBackend
    from agent.http import RetryPolicy

    with FakeSGLang(tokenizer_dir=str(tiny_model_dir)) as srv:
        b = SGLangBackend(srv.url, str(tiny_model_dir), policy=RetryPolicy(retries=1, backoff_s=0.01, timeout_s=60))
        msgs = [{"role": "user", "content": "hi"}]
        srv.faults = ["200_error"]
        out = await b.generate(msgs, SamplingParams(max_tokens=8))
        assert len(srv.bodies) == 2 and len(out.tokens) > 0
        srv.faults = ["200_error"] * 3
        with pytest.raises(BadReply, match="replies in a row refused; .*answered 200 with an error object: scheduler busy"):
            await b.generate(msgs, SamplingParams(max_tokens=8))
        await b.aclose()


@pytest.mark.parametrize("argv,message", [
    (["agent.run", "--method", "react", "--limit", "-2"], "argument --limit: must be at least 1, got -2"),
    (["agent.run", "--method", "react", "--timeout", "-5"], "argument --timeout: must be a number above 0, got -5"),
    (["agent.run", "--method", "react", "--request-timeout", "nan"], "argument --request-timeout: must be a number"),
    (["agent.run", "--method", "react", "--processes", "1000"], "argument --processes: 1000 processes on a machine"),
    (["agent.ledger", "RUN", "--gpus-per-server", "-3"], "argument --gpus-per-server: must be at least 1, got -3"),
    (["probes.entropy", "RUN", "--limit", "0"], "argument --limit: must be at least 1, got 0"),
    (["serving.launch", "--timeout", "-1", "9b"], "argument --timeout: must be a number above 0, got -1"),
    # issue 55 (low): sampling values no server can honour, and ports that do not exist
    (["agent.run", "--method", "react", "--temperature", "nan"], "argument --temperature: must be in [0, 100], got nan"),
    (["agent.run", "--method", "react", "--temperature", "-1"], "argument --temperature: must be in [0, 100], got -1"),
    (["agent.run", "--method", "react", "--top-p", "7"], "argument --top-p: must be in (0, 1], got 7"),
    (["agent.run", "--method", "react", "--top-logprobs", "-1"], "argument --top-logprobs: must be in [0, 1024], got -1"),
    (["serving.launch", "--port", "99999", "9b"], "argument --port: must be in [1, 65535], got 99999"),
])
def test_values_that_would_make_nonsense_are_refused_naming_the_flag(argv, message):
    import importlib
    import io
    from contextlib import redirect_stderr

    mod = importlib.import_module(argv[0] + (".cli" if argv[0] in ("agent.run", "probes.entropy") else ""))
    err = io.StringIO()
    with redirect_stderr(err), pytest.raises(SystemExit) as e:
        mod.main(argv[1:])
    assert e.value.code == 2 and message in err.getvalue()


def test_table1_footnotes_the_rows_the_release_counts_against_our_n(tmp_path, red_image):
    """U8: the release runs every manifest row (pipelines/base_pipeline.py:103-116); we read a repeated id once."""
    from analysis.tables import table1

    d = tmp_path / "mmsearch"
    (d / "imgs").mkdir(parents=True)
    (d / "imgs" / "a.png").write_bytes(red_image.read_bytes())
    rows = [{"id": i, "query": f"q{i}", "query_images": ["a.png"], "answer": "1911"} for i in ("1", "2", "3", "2", "3")]
    (d / "data_unified.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    t = table1([_direct(tmp_path, "dups", ["<answer>1911</answer>"] * 3, benchmark=str(d), skip_bad_rows=True)])
    assert "mmsearch (n=3)" in t.columns
    assert ("**n counts each manifest id once** (ours; the release runs every row, pipelines/base_pipeline.py:103-116): "
            "mmsearch: 5 rows, 2 repeating an earlier id, n = 3. Over these benchmarks: n = 3 here, 5 rows as the "
            "release counts them.") in t.attrs["note"]
    assert "counts each manifest id once" not in table1([_direct(tmp_path, "plain", ["<answer>1911</answer>"] * 2,
                                                                 limit=2)]).attrs["note"]


def test_openrouter_asks_for_logprobs_only_when_told_and_the_entropy_probe_refuses_a_run_without(tmp_path, capsys,
                                                                                                 monkeypatch):
    """U10: the release sends no logprob fields (utils/search_backbone_model.py:116-122); many OpenRouter providers
    have none. Asked for only with --top-logprobs; a reply without them is accepted; the entropy probe refuses."""
    from probes import entropy

    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or-test")
    with FakeSGLang(reply="k</think>\n\n<answer>1911</answer>") as srv:
        args = ["--method", "react", "--backend", "openai", "--server", "openrouter", "--endpoint", srv.url,
                "--api-key-env", "OPENROUTER_API_KEY", "--limit", "2", "--no-progress"]
        assert run_main([*args, "--out", str(tmp_path / "plain")]) == 0
        assert srv.bodies and not any({"logprobs", "top_logprobs"} & set(b) for b in srv.bodies)
        # OpenRouter's documented defaults (top_k 0 = off, min_p 0, repetition_penalty 1) are left out, never sent
        # out of range (our "off" is top_k -1)
        assert not any({"top_k", "min_p", "repetition_penalty"} & set(b) for b in srv.bodies)
        srv.no_logprobs = True  # a provider that sends none even when asked
        assert run_main([*args, "--top-logprobs", "20", "--out", str(tmp_path / "asked")]) == 0
        assert srv.bodies[-1]["logprobs"] is True and srv.bodies[-1]["top_logprobs"] == 20
    plain, asked = load_run(tmp_path / "plain"), load_run(tmp_path / "asked")
    assert plain.header.logprobs == "absent" and asked.header.logprobs == "requested"
    assert [ln.status for ln in asked.lines] == ["ok", "ok"]  # no logprobs in the replies: accepted
    capsys.readouterr()
    assert entropy.main([str(tmp_path / "plain"), "--mode", "teacher-forced", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "recorded no logprobs" in err and "--top-logprobs" in err and "Traceback" not in err


def test_server_facts_are_recorded_and_runs_from_servers_that_compute_differently_are_never_pooled(tmp_path, capsys):
    """The header records what /server_info says; a resume, a second endpoint or a table row over a server with
    another dtype, quantization or deterministic mode is refused, naming the difference. The deterministic mode
    with the radix cache off is warned about."""
    import asyncio

    from agent.identity import server_differences
    from agent.judge import judge_run
    from agent.rundir import RunError
    from analysis.tables import table1

    with FakeSGLang(reply=agent_policy) as a, FakeSGLang(reply=agent_policy) as b:
        b.server_args = {"dtype": "float16"}
        assert run_main(_cli(a.url, tmp_path / "r", "--limit", "1")) == 0
        facts = load_run(tmp_path / "r").header.model.server
        assert facts["dtype"] == "auto" and facts["version"] == "0.5.23" and facts["attention_backend"] == "fa3"
        capsys.readouterr()
        assert run_main(_cli(b.url, tmp_path / "r", "--limit", "2")) == 2             # resume on another server
        assert "the servers differ in dtype: 'auto' vs 'float16'" in capsys.readouterr().err
        assert run_main(_cli(a.url, tmp_path / "two", "--endpoint", b.url, "--limit", "1")) == 2  # two endpoints
        assert "dtype: 'auto' vs 'float16'" in capsys.readouterr().err
        a.server_args = {"enable_deterministic_inference": True, "disable_radix_cache": True, "attention_backend": "flashinfer"}
        assert run_main(_cli(a.url, tmp_path / "det", "--limit", "1", "--seed", "1")) == 0
        assert "turned its radix cache off" in capsys.readouterr().err
    h = load_run(tmp_path / "det").header.model.as_recorded()
    assert server_differences(load_run(tmp_path / "r").header.model.as_recorded(), h).startswith(
        "the servers differ in enable_deterministic_inference: False vs True")
    for d in ("r", "det"):
        asyncio.run(judge_run(tmp_path / d, judge="exact", progress=False))
    with pytest.raises(RunError, match="cannot be pooled: the servers differ in enable_deterministic_inference"):
        table1([tmp_path / "r", tmp_path / "det"])


def test_a_server_that_cannot_say_its_facts_is_never_pooled_with_the_run_unless_allowed_and_recorded(tmp_path, capsys):
    """A resume on a server whose /server_info answers 404, or lacks a fact the run recorded (dtype), cannot be
    told apart from one that computes differently: refused, naming why and the flag; with
    --allow-unverified-server it goes on, and header.json's resume entry says so (issue 55, item 5)."""
    out = tmp_path / "r"
    with FakeSGLang(reply=agent_policy) as srv:
        assert run_main(_cli(srv.url, out, "--limit", "1")) == 0
        capsys.readouterr()
        for args, why in (({"dtype": None}, "only one of them says dtype"), (None, "this server gives none")):
            srv.server_args = args
            assert run_main(_cli(srv.url, out, "--limit", "2")) == 2
            err = capsys.readouterr().err
            assert why in err and "--allow-unverified-server" in err and "Traceback" not in err
        assert len(load_run(out).index) == 1  # nothing ran
        assert run_main(_cli(srv.url, out, "--limit", "2", "--allow-unverified-server")) == 0
        assert "resumed with --allow-unverified-server" in capsys.readouterr().err
    header = load_run(out).header
    assert "this server gives none" in header.resumed[-1].unverified_server and len(load_run(out).index) == 2


def test_the_logprob_mode_is_recorded_with_its_source_and_runs_that_differ_in_it_are_never_pooled(
        tmp_path, capsys, monkeypatch):
    """Raw and scaled logprobs differ at T != 1 and /server_info cannot say which a server returns: the header
    records the mode and where it came from (the launcher's endpoints.json, --logprob-mode, or SGLang's default);
    a flag the launcher's record contradicts, a resume in the other mode and a table over both are refused (issue
    58, item 4). The SSM-state dtype is a recorded fact that refuses pooling too."""
    import asyncio

    from agent.judge import judge_run
    from agent.rundir import RunError
    from analysis.tables import table1
    from serving.endpoints import remember, write_endpoints

    monkeypatch.setenv("MMCF_STATE_DIR", str(tmp_path / "state"))
    with FakeSGLang(reply=agent_policy) as launched, FakeSGLang(reply=agent_policy) as elsewhere:
        serve = tmp_path / "serve"
        serve.mkdir()
        write_endpoints(serve, [{"url": launched.url, "kind": "server", "status": "stopped", "logprob_mode": "scaled"},
                                {"url": launched.url, "kind": "server", "status": "running", "logprob_mode": "raw"}])
        remember(serve)
        assert run_main(_cli(launched.url, tmp_path / "raw", "--limit", "1")) == 0
        assert run_main(_cli(elsewhere.url, tmp_path / "scaled", "--limit", "1")) == 0
        assert run_main(_cli(elsewhere.url, tmp_path / "flag", "--limit", "1", "--logprob-mode", "raw")) == 0
        capsys.readouterr()
        assert run_main(_cli(launched.url, tmp_path / "bad", "--limit", "1", "--logprob-mode", "scaled")) == 2
        err = capsys.readouterr().err
        assert "--logprob-mode scaled, but the launcher started" in err and "raw" in err and "Traceback" not in err
        assert not (tmp_path / "bad" / "results.jsonl").exists()
        assert run_main(_cli(elsewhere.url, tmp_path / "raw", "--limit", "2")) == 2  # resume in the other mode
        assert "logprob mode: raw -> scaled" in capsys.readouterr().err
        elsewhere.server_args = {"mamba_ssm_dtype": "bfloat16"}
        assert run_main(_cli(elsewhere.url, tmp_path / "bf16", "--limit", "1")) == 0
    backend = {d: load_run(tmp_path / d).header.backend.as_recorded() for d in ("raw", "scaled", "flag", "bf16")}
    assert (backend["raw"]["logprob_mode"], backend["raw"]["logprob_mode_source"]) == ("raw", "launcher")
    assert (backend["scaled"]["logprob_mode"], backend["scaled"]["logprob_mode_source"]) == ("scaled", "default")
    assert (backend["flag"]["logprob_mode"], backend["flag"]["logprob_mode_source"]) == ("raw", "flag")
    assert load_run(tmp_path / "bf16").header.model.server["mamba_ssm_dtype"] == "bfloat16"
    for d in ("raw", "scaled", "bf16"):
        asyncio.run(judge_run(tmp_path / d, judge="exact", progress=False))
    with pytest.raises(RunError, match=r"cannot be pooled: their logprob modes differ \(raw vs scaled"):
        table1([tmp_path / "raw", tmp_path / "scaled"])
    with pytest.raises(RunError, match="cannot be pooled: the servers differ in mamba_ssm_dtype"):
        table1([tmp_path / "scaled", tmp_path / "bf16"])
