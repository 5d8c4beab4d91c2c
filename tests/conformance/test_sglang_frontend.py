"""The toolkit's chain against SGLang 0.5.23's own HTTP server, TokenizerManager and DetokenizerManager, with our
scheduler stand-in (``serving/fakes/standin.py``) as the only piece not SGLang's (issue 21).

Each run is also made against the loopback fake (``serving/fakes/sglang_server.py``); the records must agree
(same fields, same token counts per call): a difference is a bug in the client or in the fake.
"""
from __future__ import annotations

import numpy as np
import pytest

from agent.identity import SERVER_FACTS
from agent.run import main as run_main
from agent.rundir import load_run
from serving.fakes.policy import agent_policy
from serving.fakes.sglang_server import FakeSGLang
from tests.guards import HANG_GUARD_S

#: What must be equal call by call, real front end vs fake (the chat path's prompt_tokens excepted: the fake does
#: not render the chat template there, see serving/fakes/sglang_server.py).
SAME = ("n_tokens", "think_tokens", "finish_reason", "text", "reasoning", "n_images", "n_query_images", "state",
        "semantics")


#: every test here starts SGLang's real front end or smg's binary (tens of seconds of set-up)
pytestmark = pytest.mark.slow


def _run(url, out, backend, model_dir, method, *extra):
    be = ["--backend", "sglang", "--model-dir", str(model_dir)] if backend == "native" else \
        ["--backend", "openai", "--server", "sglang"]
    return run_main(["--method", method, *be, "--endpoint", url, "--benchmark", "demo", "--limit", "2", "--t-max", "6",
                     "--out", str(out), "--no-progress", "--seed", "5", "--request-timeout", "120", *extra])


def _served(srv) -> int:
    """How many model requests SGLang's server has answered so far (its access log)."""
    log = srv.tail(10**9)
    return log.count('"POST /generate HTTP') + log.count('"POST /v1/chat/completions HTTP')


def _calls(line):
    return [e for e in line["events"] if e["type"] == "llm_call"]


@pytest.mark.parametrize("method", ["react", "mmcontextfold"])
@pytest.mark.parametrize("backend", ["native", "chat"])
def test_the_agents_run_against_sglangs_real_server_and_record_what_the_fake_records(
        real_sglang, tiny_model_dir, tmp_path, backend, method):
    before = _served(real_sglang)
    assert _run(real_sglang.url, tmp_path / "real", backend, tiny_model_dir, method) == 0, real_sglang.tail()
    n_calls = sum(ln.n_calls for ln in load_run(tmp_path / "real").index)
    assert _served(real_sglang) - before == n_calls  # every call answered once: nothing lost, nothing retried
    with FakeSGLang(tokenizer_dir=str(tiny_model_dir), reply=agent_policy, model_name="tiny-qwen35") as fake:
        assert _run(fake.url, tmp_path / "fake", backend, tiny_model_dir, method) == 0
    real, fake = load_run(tmp_path / "real"), load_run(tmp_path / "fake")
    assert real.header.model.served_model == "tiny-qwen35"
    assert real.header.model.weights == (str(tiny_model_dir) if backend == "native" else None)
    facts = real.header.model.server  # what SGLang's /server_info says about how it computes
    assert facts["version"] == "0.5.23" and facts["model_path"] == str(tiny_model_dir) and set(facts) == set(SERVER_FACTS)
    assert facts["enable_deterministic_inference"] is False and facts["mamba_radix_cache_strategy"]
    rl = sorted((ln.as_recorded() for ln in real.lines), key=lambda ln: ln["sample_id"])
    fl = sorted((ln.as_recorded() for ln in fake.lines), key=lambda ln: ln["sample_id"])
    assert [ln["status"] for ln in rl] == ["ok", "ok"] and len(rl) == len(fl)
    for a, b in zip(rl, fl):
        assert set(a) == set(b)
        ca, cb = _calls(a), _calls(b)
        assert len(ca) == len(cb) >= 2
        for x, y in zip(ca, cb):
            assert set(x) == set(y), set(x) ^ set(y)
            for k in SAME:
                assert x[k] == y[k], (k, x["index"], x[k], y[k])
            assert x["usage"]["completion_tokens"] == y["usage"]["completion_tokens"] == x["n_tokens"]
            if backend == "native":  # the fake expands images with the model's processor, as SGLang does
                assert x["usage"]["prompt_tokens"] == y["usage"]["prompt_tokens"]
            assert x["finish_reason"] == "stop" and x["reasoning"] and x["think_tokens"] > 0
        # every token of the real server's reply is in the sidecar, with 20 alternatives each
        tok = real.tokens(real.full(next(s for s in real.index if s.sample_id == a["sample_id"])))
        assert tok["top_logprobs"].shape[1] == 20 and len(tok["id"]) == sum(c["n_tokens"] for c in ca)
        assert np.isfinite(tok["logprob"]).all() and (tok["logprob"] <= 0).all()
    if backend == "native" and method == "react":  # the probes' records too: same steps, same token counts
        import pandas as pd

        from probes.entropy import main as entropy_main

        for mode in ("regenerate", "teacher-forced"):
            frames = []
            for name, url in (("real", real_sglang.url), ("fake", None)):
                if url is None:
                    with FakeSGLang(tokenizer_dir=str(tiny_model_dir), reply=agent_policy, model_name="tiny-qwen35") as f:
                        rc = entropy_main([str(tmp_path / name), "--mode", mode, "--backend", "sglang", "--endpoint",
                                           f.url, "--model-dir", str(tiny_model_dir), "--no-progress"])
                else:
                    rc = entropy_main([str(tmp_path / name), "--mode", mode, "--backend", "sglang", "--endpoint", url,
                                       "--model-dir", str(tiny_model_dir), "--no-progress"])
                assert rc == 0, (name, mode)
                frames.append(pd.read_csv(tmp_path / name / "probes" / f"entropy-{mode}" / "steps.csv"))
                # the run's recorded prompt ids were what the probe sent (agent/backends/pieces.py): on SGLang's own
                # front end, the scorings and regenerations of ids it never tokenised itself
                import json

                used = json.loads((tmp_path / name / "probes" / f"entropy-{mode}" / "probe.json").read_text())
                assert used["prompt_ids"]["pieces_from_the_record"] > 0, used["prompt_ids"]
            cols = ["sample_id", "step", "state", "n_images", "n_query_images", "n_tokens", "n_think"]
            r, f_ = (x.sort_values(["sample_id", "step"])[cols].reset_index(drop=True) for x in frames)
            assert len(r) > 0 and r.equals(f_), (mode, r, f_)
        # and the removal replays: the same outcome per (sample, trial, k), call by call the same replayed calls
        from probes.removal import main as removal_main

        outs = []
        for name in ("real", "fake"):
            if name == "fake":
                with FakeSGLang(tokenizer_dir=str(tiny_model_dir), reply=agent_policy, model_name="tiny-qwen35") as f:
                    rc = removal_main([str(tmp_path / name), "--steps", "1..2", "--judge", "exact", "--backend", "sglang",
                                       "--endpoint", f.url, "--model-dir", str(tiny_model_dir), "--no-progress"])
            else:
                rc = removal_main([str(tmp_path / name), "--steps", "1..2", "--judge", "exact", "--backend", "sglang",
                                   "--endpoint", real_sglang.url, "--model-dir", str(tiny_model_dir), "--no-progress"])
            assert rc == 0, name
            o = pd.read_csv(tmp_path / name / "probes" / "removal" / "outcomes.csv")
            outs.append(o.sort_values(["sample_id", "trial", "k"]).reset_index(drop=True))
            reps = [load_run(tmp_path / name / "probes" / "removal" / f"k{k}") for k in (1, 2)]
            outs.append([[(c.index, c.n_tokens, c.finish_reason, c.n_query_images) for c in ln.calls]
                         for rr in reps for ln in sorted(rr.index, key=lambda x: x.sample_id)])
        cols = [c for c in ("sample_id", "trial", "k", "replay_status", "replay_correct") if c in outs[0]]
        assert len(outs[0]) > 0 and outs[0][cols].equals(outs[2][cols])
        assert outs[1] == outs[3] and outs[1]


async def test_teacher_forced_scoring_through_the_real_front_end_with_and_without_images(
        real_sglang_model, tiny_model_dir, red_image):
    """Token ids all the way, images included (SGLang takes input_ids with image_data and expands the images):
    a continuation starting with "\\n" after the <think>\\n pre-fill is scored exactly, never re-tokenised."""
    from agent.backends.base import Continuation, SamplingParams
    from agent.backends.sglang_native import SGLangBackend
    from agent.http import RetryPolicy

    b = SGLangBackend(real_sglang_model.url, str(tiny_model_dir), policy=RetryPolicy(retries=1, timeout_s=300))
    with_img = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": str(red_image)}},
                                              {"type": "text", "text": "What colour is it?"}]}]
    text_only = [{"role": "user", "content": [{"type": "text", "text": "What colour is it?"}]}]
    cont_ids = b.tok("\nRed, I think.\n</think>\n\nRed.", add_special_tokens=False)["input_ids"]
    assert b.tok.decode(cont_ids[:1]) == "\n"  # the case that merged into "\n\n" when text was re-tokenised
    try:
        gen = await b.generate(with_img, SamplingParams(max_tokens=6, seed=1))
        assert len(gen.tokens) == 6 and gen.finish_reason == "length" and gen.usage.prompt_tokens > 20
        s_img = await b.score(with_img, Continuation(ids=cont_ids))
        s_txt = await b.score(text_only, Continuation(ids=cont_ids))
    finally:
        await b.aclose()
    for s in (s_img, s_txt):
        assert [int(i) for i in s.tokens.ids] == cont_ids  # verified ids: nothing drifted
        assert s.tokens.top_logprobs.shape == (len(cont_ids), 20) and np.isfinite(s.tokens.logprobs).all()
    assert s_img.request["by"] == "ids" and s_img.request["image_sha256"]
    # the pixels reached the model: the same tokens are scored differently with the image
    assert not np.allclose(s_img.tokens.logprobs, s_txt.tokens.logprobs)


async def test_flat_top_logprobs_from_the_real_front_end_are_the_nested_ones(real_sglang_model, tiny_model_dir, red_image):
    """SGLang's own TokenizerManager builds the flat base64 arrays our scoring asks for (return_flat_raw_top_logprobs
    with _b64): parsed, they are bit for bit the arrays of its nested triples, with and without an image."""
    from agent.backends.base import Continuation
    from agent.backends.sglang_native import SGLangBackend
    from agent.http import RetryPolicy

    policy = RetryPolicy(retries=1, timeout_s=300)
    flat = SGLangBackend(real_sglang_model.url, str(tiny_model_dir), policy=policy)
    nested = SGLangBackend(real_sglang_model.url, str(tiny_model_dir), policy=policy, flat_logprobs=False)
    with_img = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": str(red_image)}},
                                              {"type": "text", "text": "What colour is it?"}]}]
    text_only = [{"role": "user", "content": [{"type": "text", "text": "What colour is it?"}]}]
    cont = Continuation(ids=flat.tok("\nRed, I think.\n</think>\n\nRed.", add_special_tokens=False)["input_ids"])
    try:
        for m in (with_img, text_only):
            a, b = await flat.score(m, cont), await nested.score(m, cont)
            assert a.request["top_logprobs_wire"] == "flat" and b.request["top_logprobs_wire"] == "nested"
            for f in ("ids", "logprobs", "top_ids", "top_logprobs", "counts"):
                assert np.array_equal(getattr(a.tokens, f), getattr(b.tokens, f)), f
            assert a.tokens.texts == b.tokens.texts and a.tokens.top_logprobs.shape == (len(cont.ids), 20)
    finally:
        await flat.aclose()
        await nested.aclose()
    assert flat.flat_logprobs  # never refused


@pytest.mark.slow
def test_probes_and_the_smoke_check_against_the_real_front_end(real_sglang_model, tiny_model_dir, tmp_path, capsys):
    """A run on the real front end with the tiny model, then both entropy modes, the removal replays and
    serving.check, all through SGLang's own server."""
    from probes.entropy import main as entropy_main
    from probes.removal import main as removal_main
    from serving.check import main as check_main

    url, md = real_sglang_model.url, str(tiny_model_dir)
    run = tmp_path / "run"
    assert run_main(["--method", "react", "--backend", "sglang", "--endpoint", url, "--model-dir", md, "--limit", "1",
                     "--t-max", "3", "--max-tokens", "12", "--out", str(run), "--no-progress"]) == 0
    be = ["--backend", "sglang", "--endpoint", url, "--model-dir", md]
    for mode in ("regenerate", "teacher-forced"):
        rc = entropy_main([str(run), "--mode", mode, *be, "--include-unparsed", "--no-progress"])
        err = capsys.readouterr().err
        # what the probe said went wrong first (pytest shortens long messages), then the server's log
        assert rc == 0, ([ln for ln in err.splitlines() if "fail" in ln or "rror" in ln], mode, err[-3000:],
                         real_sglang_model.tail())
        steps = (run / "probes" / f"entropy-{mode}" / "steps.csv").read_text().splitlines()
        assert len(steps) >= 2
    rc = removal_main([str(run), "--steps", "1..2", "--judge", "exact", *be, "--no-progress"])
    assert rc in (0, 3), capsys.readouterr().err[-2000:]
    assert (run / "probes" / "removal").is_dir()
    assert check_main(["--endpoint", url, "--backend", "sglang", "--model-dir", md]) == 0
    assert check_main(["--endpoint", url, "--backend", "openai", "--server", "sglang"]) == 0


def test_a_request_the_stand_in_cannot_serve_comes_back_as_sglangs_error_not_a_hang(real_sglang_model):
    import httpx

    r = httpx.post(real_sglang_model.url + "/generate", timeout=HANG_GUARD_S, json={
        "text": "hello", "sampling_params": {"max_new_tokens": 0}, "return_logprob": True, "logprob_start_len": 999})
    assert r.status_code == 400 and "logprob_start_len=999 is higher than the number of input tokens" in r.text



def test_the_fidelity_check_on_the_real_front_end_all_four_checks_and_an_injected_leak(
        real_sglang_model, tiny_model_dir, tmp_path, capsys):
    """probes.fidelity through SGLang's own server (the tiny model computing every logprob): warm, cold (its
    /flush_cache), the chat path (SGLang renders the template and processes the image itself) and the
    in-process transformers reference all agree; then the stand-in leaks cached state into repeated scorings
    and the check refuses, naming the warm check (the cold one, after a flush, still agrees)."""
    import json

    from probes.fidelity import main as fidelity_main

    url, md = real_sglang_model.url, str(tiny_model_dir)
    run = tmp_path / "run"
    assert run_main(["--method", "react", "--backend", "sglang", "--endpoint", url, "--model-dir", md, "--limit", "1",
                     "--t-max", "2", "--max-tokens", "12", "--out", str(run), "--no-progress"]) == 0
    args = [str(run), "--backend", "sglang", "--endpoint", url, "--model-dir", md, "--samples", "1"]
    rc = fidelity_main(args + ["--reference-model-dir", md])
    rep = json.loads((run / "probes" / "fidelity" / "fidelity.json").read_text())
    assert rc == 0, (rep, capsys.readouterr().err[-2000:], real_sglang_model.tail())
    c = rep["checks"]
    assert all(c[k]["ok"] and c[k]["n_tokens"] > 0 for k in ("warm", "cold", "local", "paths")), c
    assert c["local"]["max_abs"] < 1e-3  # float32 on both sides: the reference agrees to rounding
    (p,) = c["paths"]["prompt_tokens"]
    assert p["native"] == p["chat"] > 50  # SGLang's chat layer expanded the image as our client did
    # the mode check on the server itself: SGLang's default (scaled) is what the run recorded
    assert c["mode"]["server"] == "scaled" == c["mode"]["recorded"] and c["mode"]["n_tokens"] > 0, c["mode"]
    real_sglang_model.original_file.write_text("1")  # as SGLANG_RETURN_ORIGINAL_LOGPROB=1: raw output logprobs
    try:
        assert fidelity_main(args + ["--no-paths"]) == 2
    finally:
        real_sglang_model.original_file.unlink()
    err = capsys.readouterr().err
    assert "mode: the server returns raw logprobs but the run records scaled" in err and "--logprob-mode raw" in err
    real_sglang_model.leak_file.write_text("0.3")
    try:
        assert fidelity_main(args) == 2
    finally:
        real_sglang_model.leak_file.unlink()
    err = capsys.readouterr().err
    assert "not fit to be probed" in err and "warm: mean |Δlogprob| 0.300" in err
    rep = json.loads((run / "probes" / "fidelity" / "fidelity.json").read_text())
    assert not rep["checks"]["warm"]["ok"] and rep["checks"]["cold"]["ok"] and rep["checks"]["paths"]["ok"]
