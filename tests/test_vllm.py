"""vLLM as a second engine (agent/backends/vllm.py): teacher-forced scoring over /v1/completions with token ids,
generation over its chat API, against a stand-in that reads and writes vLLM 0.33.0's own request and response models
(tests/fakes/vllm_server.py, the tiny model's real logprobs); the fidelity check's mode reading; engines not mixed."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from types import SimpleNamespace

import numpy as np
import pytest

from agent.backends import Continuation, make_backend
from agent.backends.base import BackendError
from agent.backends.vllm import check_logprobs_mode
from agent.rundir import RunError
from analysis.pooling import refuse_mixed_servers
from tests.conftest import REPO
from tests.guards import HANG_GUARD_S
from tests.test_serving_launch import free_port

SITE = REPO / ".venv-vllm" / "site"
pytestmark = pytest.mark.skipif(not (SITE / ".mmcf-installed").is_file(),
                                reason="vLLM's conformance layer is not built: bash scripts/vllm_conformance.sh "
                                       "(scripts/test.sh builds it)")
PYPATH = os.pathsep.join([str(REPO), str(SITE), str(REPO / ".venv-sglang" / "site")])
MSGS = [{"role": "user", "content": "In which year was the bridge in the photo opened?"}]


def _standin(tiny_model_dir, *extra, trust: bool = True):
    port = free_port()
    p = subprocess.Popen([sys.executable, str(REPO / "tests" / "fakes" / "vllm_server.py"), "--port", str(port),
                          "--model-dir", str(tiny_model_dir), *(["--trust-request-chat-template"] if trust else []),
                          *extra], env={**os.environ, "PYTHONPATH": PYPATH},
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    end = time.monotonic() + HANG_GUARD_S
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
            return p, f"http://127.0.0.1:{port}"
        except OSError:
            if p.poll() is not None or time.monotonic() > end:
                p.kill()
                raise AssertionError(f"the vLLM stand-in did not start: {p.stderr.read().decode()[-3000:]}")
            time.sleep(0.2)


@pytest.fixture(scope="module")
def vllm(tiny_model_dir):
    p, url = _standin(tiny_model_dir)
    yield url
    p.kill()
    p.wait()


def test_scoring_over_completions_is_the_models_own_raw_logprobs_and_vllm_reads_the_request_as_meant(vllm, tiny_model_dir):
    v = make_backend("vllm", endpoint=vllm, model_dir=str(tiny_model_dir), logprob_mode="raw")
    local = make_backend("local", model_dir=str(tiny_model_dir), logprob_mode="raw")
    cont = Continuation(text="The bridge looks like steel, so maybe the 1930s.")

    async def both():
        try:
            return await v.score(MSGS, cont), await local.score(MSGS, cont)
        finally:
            await v.aclose()
    got, ref = asyncio.run(both())
    assert got.semantics.kind == "raw" and len(got.tokens) == len(ref.tokens) > 5
    assert np.array_equal(got.tokens.ids, ref.tokens.ids) and got.tokens.think.all() == ref.tokens.think.all()
    np.testing.assert_allclose(got.tokens.logprobs, ref.tokens.logprobs, atol=1e-4)
    np.testing.assert_allclose(got.top_logprob_matrix(20), ref.top_logprob_matrix(20), atol=1e-4)
    assert np.array_equal(got.tokens.top_ids[:, :20], ref.tokens.top_ids[:, :20])
    # the body as vLLM's own CompletionRequest read it into its SamplingParams (the stand-in keeps the last)
    sp = json.load(urllib.request.urlopen(vllm + "/_last_sampling", timeout=HANG_GUARD_S))
    assert sp["prompt_logprobs"] == 20 and sp["temperature"] == 0.0 and sp["max_tokens"] == 1 and sp["top_p"] == 1.0
    assert sp["skip_reading_prefix_cache"] is True  # vLLM reuses no cached prefix for a scoring request
    body, ids, _ = v.score_payload(MSGS, cont)
    assert [int(i) for i in body["prompt"][-len(ids):]] == ids


async def _closing(backend, work):
    try:
        return await work
    finally:
        await backend.aclose()


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=HANG_GUARD_S))


def test_a_prompt_with_images_is_scored_over_the_chat_route_at_the_same_positions(vllm, tiny_model_dir, red_image):
    """The chat route (the model's template sent with the continuation appended) scores the same tokens at the same
    positions as the token-id route: the stand-in renders images as their placeholder tokens on both."""
    v = make_backend("vllm", endpoint=vllm, model_dir=str(tiny_model_dir), logprob_mode="raw")
    msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": str(red_image)}},
                                         {"type": "text", "text": "What colour is this?"}]}]
    cont = Continuation(text="It looks red to me.")

    async def scored():
        try:
            return await v.score(msgs, cont)
        finally:
            await v.aclose()
    got = asyncio.run(scored())
    assert got.request["by"] == "text" and got.request["image_sha256"] and got.tokens.think.all()
    body, ids = v.chat_score_payload(msgs, cont)
    assert body["chat_template"].endswith("{{- mmcf_continuation }}{%- endif %}") and body["return_token_ids"]
    # the same prompt by token ids: the local render (images as their placeholders) plus the continuation
    from agent.backends.messages import split_text_and_images

    hf, _ = split_text_and_images(msgs)
    prompt = v.tok.apply_chat_template(hf, add_generation_prompt=True, tokenize=False, enable_thinking=True)
    full = [int(i) for i in v.prompt_ids(prompt)] + ids
    ref = _post(vllm + "/v1/completions", {"model": v.model, "prompt": full, "max_tokens": 1, "temperature": 0,
                                           "prompt_logprobs": 20})
    lps = [e[str(t)]["logprob"] for e, t in zip(ref["choices"][0]["prompt_logprobs"][-len(ids):], ids)]
    np.testing.assert_allclose(got.tokens.logprobs, lps, atol=1e-5)
    assert list(got.tokens.ids) == ids


def test_what_vllm_cannot_score_is_refused_naming_why(vllm, tiny_model_dir, red_image):
    v = make_backend("vllm", endpoint=vllm, model_dir=str(tiny_model_dir), logprob_mode="raw")
    with_image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": str(red_image)}},
                                               {"type": "text", "text": "What is this?"}]}]
    # a sampled split the tokenizer would not make ("a", "s", "k" for "ask"): the chat route tokenises the text again
    split = [v.tok("a", add_special_tokens=False)["input_ids"][0], v.tok("s", add_special_tokens=False)["input_ids"][0],
             v.tok("k", add_special_tokens=False)["input_ids"][0]]
    assert v.tok("ask", add_special_tokens=False)["input_ids"] != split
    with pytest.raises(BackendError, match="splits the continuation's text otherwise"):
        asyncio.run(_closing(v, v.score(with_image, Continuation(ids=split))))
    with pytest.raises(BackendError, match="scaled scoring is not available"):
        asyncio.run(_closing(v, v.score(MSGS, Continuation(text="Red."), temperature=0.2)))
    with pytest.raises(BackendError, match="--logprob-mode raw"):
        make_backend("vllm", endpoint=vllm, model_dir=str(tiny_model_dir), logprob_mode="scaled")
    for mode in ("processed_logprobs", "raw_logits", "processed_logits"):
        with pytest.raises(BackendError, match="raw_logprobs"):
            check_logprobs_mode(mode)
    check_logprobs_mode("raw_logprobs")
    # a reply whose positions do not hold the continuation's tokens (a fault of ours: another prompt scored)
    reply = {"choices": [{"index": 0, "text": "", "prompt_logprobs": [None, {"5": {"logprob": -1.0, "rank": 1}},
                                                                      {"6": {"logprob": -2.0, "rank": 1}}]}]}
    with pytest.raises(BackendError, match="no logprob for the continuation's token 7"):
        v.parse_score(reply, [7], k=1)


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=HANG_GUARD_S)


@pytest.mark.slow
def test_a_react_run_its_entropy_probe_and_an_mmcontextfold_run_complete_on_vllm(vllm, tiny_model_dir, tmp_path):
    model = ["--backend", "vllm", "--endpoint", vllm, "--model-dir", str(tiny_model_dir)]
    react, fold = tmp_path / "react", tmp_path / "fold"
    r = _cli("agent.run", "--method", "react", "--benchmark", "demo", "--limit", "2", *model, "--out", str(react),
             "--no-progress")
    assert r.returncode == 0, r.stderr[-3000:]
    h = json.loads((react / "header.json").read_text())
    assert h["backend"]["kind"] == "vllm" and h["backend"]["server"] == "vllm" and h["backend"]["logprob_mode"] == "raw"
    assert h["model"]["backend"] == "vllm" and h["model"]["server"] == {"version": "0.33.0"}
    r = _cli("probes.entropy", str(react), "--no-progress")
    assert r.returncode == 0, r.stderr[-3000:]
    fid = json.loads((react / "probes" / "fidelity" / "fidelity.json").read_text())
    assert fid["ok"] and fid["checks"]["mode"]["server"] == "raw" and fid["checks"]["warm"]["calls"] == 4
    assert (react / "probes" / "entropy-regenerate" / "steps.parquet").is_file()
    r = _cli("probes.entropy", str(react), "--mode", "teacher-forced", "--no-progress")
    assert r.returncode == 0, r.stderr[-3000:]
    probe = json.loads((react / "probes" / "entropy-teacher-forced" / "probe.json").read_text())
    assert probe["fidelity"]["ok"] and (react / "probes" / "entropy-teacher-forced" / "steps.parquet").is_file()
    fid = json.loads((react / "probes" / "fidelity" / "fidelity.json").read_text())
    assert fid["checks"]["warm"]["calls"] == 4  # two on the calls' text, two with their images
    r = _cli("agent.run", "--method", "mmcontextfold", "--benchmark", "demo", "--limit", "2", *model, "--out", str(fold),
             "--no-progress")
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [json.loads(x) for x in (fold / "results.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and all(ln["status"] == "ok" for ln in lines)


def _react_run(url: str, tiny_model_dir, out):
    r = _cli("agent.run", "--method", "react", "--benchmark", "demo", "--limit", "1", "--backend", "vllm",
             "--endpoint", url, "--model-dir", str(tiny_model_dir), "--out", str(out), "--no-progress")
    assert r.returncode == 0, r.stderr[-3000:]
    return out


@pytest.mark.slow
def test_servers_started_with_processed_logprobs_or_without_trusted_templates_are_refused(vllm, tiny_model_dir,
                                                                                        tmp_path):
    run = _react_run(vllm, tiny_model_dir, tmp_path / "react")
    p, url = _standin(tiny_model_dir, "--logprobs-mode", "processed_logprobs")
    try:
        r = _cli("probes.fidelity", str(run), "--backend", "vllm", "--endpoint", url, "--model-dir", str(tiny_model_dir))
        assert r.returncode == 2, r.stdout + r.stderr
        mode = json.loads((run / "probes" / "fidelity" / "fidelity.json").read_text())["checks"]["mode"]
        assert mode["server"] == "scaled" and mode["recorded"] == "raw" and not mode["ok"]
        _post(url + "/_restart_as", {"logprobs_mode": "raw_logprobs", "trust_request_chat_template": False})
        r = _cli("probes.entropy", str(run), "--mode", "teacher-forced", "--endpoint", url, "--no-progress")
        assert r.returncode != 0 and "--trust-request-chat-template" in r.stderr and "Traceback" not in r.stderr
        out = run / "probes" / "entropy-teacher-forced"
        assert not (out / "steps.parquet").exists()
        assert not (out / "steps.jsonl").exists() or not (out / "steps.jsonl").read_bytes().strip()  # no step scored
    finally:
        p.kill()
        p.wait()


def test_runs_of_two_engines_are_not_pooled():
    def run(kind, server, path):
        return SimpleNamespace(path=path, header={"backend": {"kind": kind, "server": server, "logprob_mode": "raw"},
                                                  "model": {"served_model": "qwen3.5-9b"}})
    refuse_mixed_servers("Table 1", [run("vllm", "vllm", "a"), run("openai", "vllm", "b")])  # one engine, two APIs
    with pytest.raises(RunError, match="different engines \\(sglang vs vllm\\)"):
        refuse_mixed_servers("Table 1", [run("sglang", "sglang", "a"), run("vllm", "vllm", "b")])


@pytest.mark.slow
def test_the_launcher_plans_and_starts_vllm_servers_and_clients_read_its_record(tiny_model_dir, tmp_path):
    from tests.test_serving_launch import LAUNCH, STOP, commands, sh

    r = sh([LAUNCH, "--dry-run", "--engine", "vllm", "--gpus", "8", "9b"])
    (cmd,) = commands(r.stdout)
    line = " ".join(cmd)
    assert "-m vllm.entrypoints.cli.main serve Qwen/Qwen3.5-9B --served-model-name qwen3.5-9b --tensor-parallel-size 4" in line
    assert "--logprobs-mode raw_logprobs --mamba-ssm-cache-dtype float32" in line and "--max-logprobs 20" in line
    assert "SGLANG_RETURN_ORIGINAL_LOGPROB" not in line and "--nccl-port" not in line
    assert "clients: --backend vllm --endpoint http://127.0.0.1:30000 --model-dir Qwen/Qwen3.5-9B" in r.stdout
    for flag in (["--logprobs", "scaled"], ["--router"], ["--deterministic"], ["--standin", "scripted"]):
        r = sh([LAUNCH, "--dry-run", "--engine", "vllm", *flag, "9b"])
        assert r.returncode == 2 and f"{flag[0]}" in r.stderr and "not offered with --engine vllm" in r.stderr
    # started for real: the stand-in as `vllm serve`, then a run that reads the launcher's record of its mode
    port, run_dir = free_port(), tmp_path / "serve"
    env = {"PYTHONPATH": PYPATH, "QWEN35_9B_PATH": str(tiny_model_dir), "MMCF_STATE_DIR": str(tmp_path / "state")}
    r = sh([LAUNCH, "--engine", "vllm", "--port", str(port), "--run-dir", str(run_dir), "--timeout", "600",
            "--gpus", "8", "--server-command", f"{sys.executable} {REPO / 'tests' / 'fakes' / 'vllm_server.py'}", "9b"],
           env=env, timeout=HANG_GUARD_S)
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        (ep,) = json.loads((run_dir / "endpoints.json").read_text())
        assert ep["engine"] == "vllm" and ep["logprob_mode"] == "raw" and ep["served_model"] == "qwen3.5-9b"
        run = tmp_path / "run"
        r = subprocess.run([sys.executable, "-m", "agent.run", "--method", "react", "--benchmark", "demo", "--limit",
                            "1", "--backend", "vllm", "--endpoint", f"http://127.0.0.1:{port}", "--model-dir",
                            str(tiny_model_dir), "--out", str(run), "--no-progress"], cwd=REPO, capture_output=True,
                           text=True, env={**os.environ, "MMCF_STATE_DIR": str(tmp_path / "state")}, timeout=HANG_GUARD_S)
        assert r.returncode == 0, r.stderr[-3000:]
        b = json.loads((run / "header.json").read_text())["backend"]
        assert b["logprob_mode"] == "raw" and b["logprob_mode_source"] == "launcher"
    finally:
        s = sh([STOP, "--run-dir", str(run_dir)])
    assert s.stdout.count("stopped") == 1
