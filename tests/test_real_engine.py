"""The real-engine tier: the whole chain against a real vLLM engine (vLLM 0.32.0's CPU build: its own scheduler,
model runner, Gated-DeltaNet kernels, chat template, Qwen-VL processor, reasoning parser) serving the embedded tiny
Qwen3.5, started by the launcher exactly as a user starts it (``serving/launch_qwen35.sh --engine vllm --device
cpu``). One engine for the module; each test asserts on what the engine returned.

    bash scripts/vllm_engine.sh && bash scripts/test.sh -m real_engine     # scripts/test.sh builds the engine too
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.request

import numpy as np
import pandas as pd
import pytest

from agent.backends import Continuation, make_backend
from agent.backends.messages import split_text_and_images
from serving.plan import VLLM_ENGINE_VENV
from tests.conftest import REPO
from tests.guards import HANG_GUARD_S
from tests.test_serving_launch import LAUNCH, STOP, free_port, sh

pytestmark = [pytest.mark.real_engine, pytest.mark.slow,
              pytest.mark.skipif(not (VLLM_ENGINE_VENV / ".mmcf-installed").is_file(),
                                 reason="vLLM's CPU build is not installed: bash scripts/vllm_engine.sh (scripts/test.sh "
                                        "installs it where the CPU has AVX2)")]


def _get(url: str):
    return json.load(urllib.request.urlopen(url, timeout=HANG_GUARD_S))


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=HANG_GUARD_S))


def _cli(*args, env=None) -> subprocess.CompletedProcess:
    bars = [] if args[0] in ("agent.preflight", "agent.ledger", "probes.fidelity") else ["--no-progress"]
    return subprocess.run([sys.executable, "-m", *args, *bars], cwd=REPO, capture_output=True, text=True,
                          timeout=HANG_GUARD_S, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def engine(tiny_model_dir, tmp_path_factory):
    """vLLM's CPU build serving the tiny model, started and stopped by the launcher."""
    port, run_dir = free_port(), tmp_path_factory.mktemp("serve")
    env = {"QWEN35_9B_PATH": str(tiny_model_dir), "MMCF_STATE_DIR": str(run_dir / "state")}
    r = sh([LAUNCH, "--engine", "vllm", "--device", "cpu", "--port", str(port), "--serve-dir", str(run_dir),
            "--timeout", str(HANG_GUARD_S), "9b"], env=env, timeout=HANG_GUARD_S)
    url = f"http://127.0.0.1:{port}"
    try:
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        yield {"url": url, "run_dir": run_dir, "launch": r, "model": ["--backend", "vllm", "--endpoint", url,
                                                                       "--model-dir", str(tiny_model_dir)]}
    finally:
        s = sh([STOP, "--serve-dir", str(run_dir)])
        assert s.returncode == 0, s.stdout + s.stderr


def _lines(run) -> list[dict]:
    return [json.loads(x) for x in (run / "results.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def react(engine, tmp_path_factory):
    """A ReAct run at the toolkit's defaults (the paper's sampling, a drawn seed sent with every call), 8 steps a
    trajectory (the probes' cost grows with the steps; the engine's behaviour does not)."""
    out = tmp_path_factory.mktemp("runs") / "react"
    r = _cli("agent.run", "--method", "react", "--benchmark", "demo", "--limit", "2", "--t-max", "8", *engine["model"],
             "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def test_the_launcher_serves_the_tiny_model_on_vllms_cpu_build_and_says_what_differs(engine, tiny_model_dir):
    out = engine["launch"].stdout
    assert "device: CPU (vLLM 0.32.0's CPU build" in out and "no prefix cache" in out
    (ep,) = json.loads((engine["run_dir"] / "endpoints.json").read_text())
    assert ep["engine"] == "vllm" and ep["device"] == "cpu" and ep["status"] == "running"
    (listed,) = _get(engine["url"] + "/v1/models")["data"]
    assert listed["id"] == "qwen3.5-9b" and listed["root"] == str(tiny_model_dir) and listed["max_model_len"] == 16384
    assert _get(engine["url"] + "/version")["version"] == "0.32.0"
    # the preflight a user runs first, against the engine
    r = _cli("agent.preflight", *engine["model"])
    assert r.returncode == 0, r.stdout + r.stderr


def test_an_output_the_context_cannot_hold_is_refused_before_any_work(engine, tmp_path):
    r = _cli("agent.run", "--method", "react", "--benchmark", "demo", "--limit", "1", *engine["model"],
             "--max-tokens", "20000", "--out", str(tmp_path / "run"))
    assert r.returncode == 2 and "--max-tokens 20000" in r.stderr and "16384" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "run" / "results.jsonl").exists()


def test_a_react_run_at_the_papers_sampling_records_what_the_engine_returned(engine, react, tiny_model_dir):
    h = json.loads((react / "header.json").read_text())
    assert h["sampling"]["temperature"] == 0.2 and h["sampling"]["top_p"] == 0.95 and h["sampling"]["seed"] is not None
    assert h["model"]["weights"] == str(tiny_model_dir)  # the engine's /v1/models root
    assert h["model"]["server"]["max_model_len"] == 16384 and h["model"]["server"]["version"] == "0.32.0"
    lines = _lines(react)
    assert len(lines) == 2 and all(ln["status"] != "error" for ln in lines)
    calls = [e for ln in lines for e in ln["events"] if e["type"] == "llm_call"]
    assert len(calls) == 16 and all(e["sampling"]["seed"] is not None for e in calls)
    # the engine survived seeded sampling, and every call's tokens are the engine's, by id, with their top 20
    assert urllib.request.urlopen(engine["url"] + "/health", timeout=HANG_GUARD_S).status == 200
    tok = pd.read_parquet(react / "tokens")
    tokz = make_backend("vllm", endpoint=engine["url"], model_dir=str(tiny_model_dir), logprob_mode="raw").tok
    assert len(tok) == sum(e["n_tokens"] for e in calls) and (tok["id"] >= 0).all()
    # each id spells the engine's text for it (a token inside a multi-byte character vLLM writes with its neighbours)
    spelled = [tokz.decode([int(i)]) for i in tok["id"]]
    whole = [(a, b) for a, b in zip(spelled, tok["text"]) if "\ufffd" not in a]
    assert len(whole) > len(tok) / 2 and all(a == b for a, b in whole)
    assert np.stack(tok["top_logprobs"].head(50).to_numpy()).shape == (50, 20)
    # cached tokens in the ledger as the engine reported them (its prefix cache is off on a CPU: 0, and said)
    r = _cli("agent.ledger", str(react))
    assert r.returncode == 0, r.stderr
    (led,) = json.loads((react / "ledger.json").read_text())["models"].values()
    assert led["calls"] == 16 and led["prompt_tokens"] == sum(e["usage"]["prompt_tokens"] for e in calls)
    assert led["cached_tokens"] == sum(e["usage"]["cached_tokens"] for e in calls) == 0
    probe = _post(engine["url"] + "/v1/chat/completions", {"model": "qwen3.5-9b", "max_tokens": 2,
                                                           "messages": [{"role": "user", "content": "hi"}]})
    assert probe["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_an_mmcontextfold_run_completes_on_the_engine(engine, tmp_path):
    out = tmp_path / "fold"
    r = _cli("agent.run", "--method", "mmcontextfold", "--benchmark", "demo", "--limit", "1", *engine["model"],
             "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    (ln,) = _lines(out)
    calls = [e for e in ln["events"] if e["type"] == "llm_call"]
    assert ln["status"] != "error" and calls and all(e["n_tokens"] > 0 for e in calls)


def test_the_engine_refuses_a_query_file_that_is_no_image_as_the_release_s_failed_call(engine, tmp_path):
    """``--protocol release --allow-missing-images`` sends an empty query file's bytes as the release does
    (``data:image/png;base64,``); vLLM cannot open them and answers 400, which the backend raises as
    :class:`RequestRefused`: the release's failed call (agent/methods/mmcontextfold_release.py ``REFUSED``; the flow
    after it: tests/test_release_faults.py). A whole release run is not made here: its 8,192-token calls take
    minutes each on a CPU."""
    from agent.backends.base import RequestRefused, SamplingParams

    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    backend = make_backend("openai", endpoint=engine["url"], server="vllm", wire="release")
    msgs = [{"role": "user", "content": [{"type": "text", "text": "Describe the image."},
                                         {"type": "image_url", "image_url": {"url": str(empty), "detail": "high"}}]}]
    sp = SamplingParams(temperature=0.0, top_p=1.0, max_tokens=4)

    async def both():
        try:
            with pytest.raises(RequestRefused, match="answered HTTP 400"):
                await backend.generate(msgs, sp)
            return await backend.generate([{"role": "user", "content": "Say hi."}], sp)
        finally:
            await backend.aclose()

    # the engine answers the next request: the refusal was that request's
    assert asyncio.run(both()).usage.completion_tokens > 0


def test_scoring_with_images_on_the_engine_matches_transformers_and_proves_the_images_arrived(engine, tiny_model_dir,
                                                                                               red_image):
    """The token-in route: ids as sent (a split the tokenizer would not make is scored as it is), the images
    expanded by the engine's processor to the length ours predicts, logprobs within the fidelity check's tolerance
    of in-process transformers on the same weights (the engine computes in bf16)."""
    v = make_backend("vllm", endpoint=engine["url"], model_dir=str(tiny_model_dir), logprob_mode="raw")
    local = make_backend("local", model_dir=str(tiny_model_dir), logprob_mode="raw")
    msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": str(red_image)}},
                                         {"type": "text", "text": "What colour is this?"}]}]
    split = [v.tok(c, add_special_tokens=False)["input_ids"][0] for c in ("a", "s", "k")]
    assert v.tok("ask", add_special_tokens=False)["input_ids"] != split
    cont = Continuation(ids=split + v.tok(" It looks red.", add_special_tokens=False)["input_ids"])

    async def both():
        try:
            return await v.score(msgs, cont), await local.score(msgs, cont)
        finally:
            await v.aclose()
    got, ref = asyncio.run(both())
    assert list(got.tokens.ids) == list(cont.ids) and got.request["endpoint"].endswith("/inference/v1/generate")
    hf, images = split_text_and_images(msgs)
    prompt = v.tok.apply_chat_template(hf, add_generation_prompt=True, tokenize=False, enable_thinking=True)
    assert got.request["prompt_tokens"] == v.expanded_prompt_len(len(v.prompt_ids(prompt)), images) + len(cont.ids)
    assert got.request["prompt_tokens"] > len(v.prompt_ids(prompt)) + len(cont.ids)  # the image took its tokens
    diff = np.abs(np.asarray(got.tokens.logprobs) - np.asarray(ref.tokens.logprobs))
    assert diff.mean() <= 0.05 and diff.max() <= 1.0


def test_the_entropy_probe_runs_in_both_modes_with_images(engine, react):
    for mode in ("regenerate", "teacher-forced"):
        r = _cli("probes.entropy", str(react), "--mode", mode, "--limit", "1")
        assert r.returncode == 0, r.stderr[-3000:]
        out = react / "probes" / f"entropy-{mode}"
        rows = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
        first = sorted(_lines(react), key=lambda ln: (ln["sample_id"], ln["trial"]))[0]
        image_steps = [e for e in first["events"] if e["type"] == "llm_call" and e["n_query_images"]]
        assert len(rows) == len(image_steps) and all(r["n_query_images"] >= 1 for r in rows)
        for r in rows:  # an entropy for each side that thought (a regenerated reply may not), raw as vLLM gives them
            assert r["semantics"] == "raw"
            for side, n in (("H_with", "n_think"), ("H_without", "n_think_without")):
                assert np.isfinite(r[side]) if r[n] else r[side] is None, (side, r)
        assert any(r["n_think"] and r["n_think_without"] for r in rows)  # ΔH is defined somewhere
        probe = json.loads((out / "probe.json").read_text())
        assert probe["fidelity"]["ok"] and probe["include_unparsed"]


def test_removal_replays_run_on_the_engine(engine, react):
    r = _cli("probes.removal", str(react), "--limit", "1", "--judge", "exact", "--steps", "1,2")
    assert r.returncode == 0, r.stderr[-3000:]
    out = pd.read_csv(react / "probes" / "removal" / "outcomes.csv")
    assert sorted(out["k"].unique()) == [1, 2] and len(out) == 2
    for k in (1, 2):
        (ln,) = _lines(react / "probes" / "removal" / f"k{k}")
        calls = [e for e in ln["events"] if e["type"] == "llm_call"]
        assert calls and all(e["n_images"] == 0 for e in calls if e["index"] >= k)


def test_the_fidelity_check_holds_the_engine_to_transformers(engine, react, tiny_model_dir):
    r = _cli("probes.fidelity", str(react), "--reference-model-dir", str(tiny_model_dir))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    fid = json.loads((react / "probes" / "fidelity" / "fidelity.json").read_text())
    local, mode = fid["checks"]["local"], fid["checks"]["mode"]
    assert fid["ok"] and local["ok"] and local["n_tokens"] > 0 and local["mean_abs"] <= local["tolerance"]["mean_abs"]
    assert mode["server"] == "raw" and mode["recorded"] == "raw"
