"""vLLM as a second engine (agent/backends/vllm.py) against a stand-in that reads and writes vLLM 0.33.0's own request
and response models (serving/fakes/vllm_server.py, the tiny model's real logprobs): the request shapes vLLM reads, and
the faults a real engine cannot be made to show cheaply (another logprobs mode, no token-in route, images reduced,
other weights under the same name, ids that do not spell the reply). The whole chain on a real vLLM engine is
tests/test_real_engine.py."""
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
from agent.backends.base import BackendError, BadReply, SamplingParams
from agent.backends.vllm import check_logprobs_mode
from agent.record import RunHeader
from agent.rundir import RunError
from analysis.pooling import refuse_mixed_servers
from tests import records
from tests.conftest import REPO
from tests.guards import HANG_GUARD_S
from tests.test_serving_launch import free_port

SITE = REPO / ".venv-vllm" / "site"
pytestmark = pytest.mark.skipif(not (SITE / ".mmcf-installed").is_file(),
                                reason="vLLM's conformance layer is not built: bash scripts/vllm_conformance.sh "
                                       "(scripts/test.sh builds it)")
PYPATH = os.pathsep.join([str(REPO), str(SITE), str(REPO / ".venv-sglang" / "site")])
MSGS = [{"role": "user", "content": "In which year was the bridge in the photo opened?"}]


def _standin(tiny_model_dir, *extra):
    port = free_port()
    p = subprocess.Popen([sys.executable, str(REPO / "serving" / "fakes" / "vllm_server.py"), "--port", str(port),
                          "--model-dir", str(tiny_model_dir), "--enable-scale-out",
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


@pytest.mark.slow
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
    body, ids, _, images, expected = v.score_payload(MSGS, cont)
    assert body["prompt"].ids()[-len(ids):].tolist() == ids and not images and expected == len(body["prompt"])


async def _closing(backend, work):
    try:
        return await work
    finally:
        await backend.aclose()


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=HANG_GUARD_S))


def _image_msgs(red_image):
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": str(red_image)}},
                                         {"type": "text", "text": "What colour is this?"}]}]


@pytest.mark.slow
def test_a_prompt_with_images_is_scored_by_ids_over_the_token_in_route(vllm, tiny_model_dir, red_image):
    """vLLM's token-in route as its own GenerateRequest reads it: the prompt's and the continuation's ids as sent
    (a split the tokenizer would not make is scored as it is), the images as content_parts, prompt_logprobs in its
    SamplingParams; the same logprobs as /v1/completions gives the expanded ids."""
    v = make_backend("vllm", endpoint=vllm, model_dir=str(tiny_model_dir), logprob_mode="raw")
    split = [v.tok(c, add_special_tokens=False)["input_ids"][0] for c in ("a", "s", "k")]
    assert v.tok("ask", add_special_tokens=False)["input_ids"] != split
    cont = Continuation(ids=split + v.tok(" It looks red.", add_special_tokens=False)["input_ids"])
    got = asyncio.run(_closing(v, v.score(_image_msgs(red_image), cont)))
    assert got.request["by"] == "ids" and got.request["image_sha256"] and got.tokens.think.all()
    assert got.request["endpoint"].endswith("/inference/v1/generate") and list(got.tokens.ids) == cont.ids
    sp = json.load(urllib.request.urlopen(vllm + "/_last_sampling", timeout=HANG_GUARD_S))
    assert sp["prompt_logprobs"] == 20 and sp["temperature"] == 0.0 and sp["max_tokens"] == 1
    body, ids, _, images, expected = v.score_payload(_image_msgs(red_image), cont)
    assert len(images) == 1 and body["content_parts"][0]["type"] == "image_url" and body["return_token_ids"]
    ref = _post(vllm + "/inference/v1/generate", {**body, "token_ids": body["token_ids"].ids().tolist(),
                                                   "content_parts": [{"type": "image_url", "url": images[0].data_uri()}]})
    expanded = ref["prompt_token_ids"]
    assert len(expanded) == expected == got.request["prompt_tokens"] and expanded[-len(ids):] == ids
    plain = _post(vllm + "/v1/completions", {"model": v.model, "prompt": expanded, "max_tokens": 1, "temperature": 0,
                                             "prompt_logprobs": 20})
    lps = [e[str(t)]["logprob"] for e, t in zip(plain["choices"][0]["prompt_logprobs"][-len(ids):], ids)]
    np.testing.assert_allclose(got.tokens.logprobs, lps, atol=1e-5)


@pytest.mark.slow
def test_what_vllm_cannot_score_is_refused_naming_why(vllm, tiny_model_dir, red_image):
    v = make_backend("vllm", endpoint=vllm, model_dir=str(tiny_model_dir), logprob_mode="raw")
    cont = Continuation(text="It looks red.")
    try:  # images reduced to one token each while the server still takes them (SGLang #39831's fault)
        _post(vllm + "/_restart_as", {"collapse_images": True})
        with pytest.raises(BackendError, match="the images did not arrive as the model sees them"):
            asyncio.run(_closing(v, v.score(_image_msgs(red_image), cont)))
        _post(vllm + "/_restart_as", {"enable_scale_out": False})  # started without its token-in route
        with pytest.raises(BackendError, match="start it with --enable-scale-out"):
            asyncio.run(_closing(make_backend("vllm", endpoint=vllm, model_dir=str(tiny_model_dir), logprob_mode="raw"),
                                 v.score(_image_msgs(red_image), cont)))
    finally:
        _post(vllm + "/_restart_as", {})
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
    reply["choices"][0]["prompt_logprobs"][2] = {"6": {"logprob": -2.0, "rank": "first"}}
    with pytest.raises(BadReply, match="not a number"):  # asked again, then the unit ends naming the field
        v.parse_score(reply, [6], k=1)


@pytest.mark.slow
def test_generated_ids_that_do_not_spell_the_reply_or_are_missing_are_refused(vllm, tiny_model_dir):
    v = make_backend("vllm", endpoint=vllm, model_dir=str(tiny_model_dir), logprob_mode="raw")
    sp = SamplingParams(max_tokens=8, top_logprobs=2)
    asyncio.run(_closing(v, v.resolve_model()))
    body = v._payload(MSGS, sp)
    assert body["return_token_ids"] is True
    reply = _post(vllm + "/v1/chat/completions", {**body, "messages": body["messages"]})
    assert list(v.parse(reply, sp).tokens.ids) == reply["choices"][0]["token_ids"]
    wrong = json.loads(json.dumps(reply))
    ids = wrong["choices"][0]["token_ids"]
    ids[0] = next(i for i in range(v.vocab) if v._decode(i) not in (v._decode(ids[0]),) and "\ufffd" not in v._decode(i))
    with pytest.raises(BackendError, match="do not spell the reply"):
        v.parse(wrong, sp)
    del wrong["choices"][0]["token_ids"]
    with pytest.raises(BackendError, match="return_token_ids"):
        v.parse(wrong, sp)


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=HANG_GUARD_S)


def _react_run(url: str, tiny_model_dir, out):
    r = _cli("agent.run", "--method", "react", "--benchmark", "demo", "--limit", "1", "--backend", "vllm",
             "--endpoint", url, "--model-dir", str(tiny_model_dir), "--out", str(out), "--no-progress")
    assert r.returncode == 0, r.stderr[-3000:]
    return out


@pytest.mark.slow
def test_a_server_with_other_logprobs_or_other_weights_under_the_same_name_is_refused(vllm, tiny_model_dir, tmp_path):
    run = _react_run(vllm, tiny_model_dir, tmp_path / "react")
    assert json.loads((run / "header.json").read_text())["model"]["weights"] == str(tiny_model_dir)
    p, url = _standin(tiny_model_dir, "--logprobs-mode", "processed_logprobs")
    try:
        r = _cli("probes.fidelity", str(run), "--backend", "vllm", "--endpoint", url, "--model-dir", str(tiny_model_dir))
        assert r.returncode == 2, r.stdout + r.stderr
        mode = json.loads((run / "probes" / "fidelity" / "fidelity.json").read_text())["checks"]["mode"]
        assert mode["server"] == "scaled" and mode["recorded"] == "raw" and not mode["ok"]
        # the same served name, other weights (a redeployed checkpoint): a resume and a probe are refused
        _post(url + "/_restart_as", {"logprobs_mode": "raw_logprobs", "root": "/checkpoints/step-900/tiny-qwen35"})
        more = subprocess.run([sys.executable, "-m", "agent.run", "--method", "react", "--benchmark", "demo",
                               "--limit", "2", "--backend", "vllm", "--endpoint", url, "--model-dir",
                               str(tiny_model_dir), "--out", str(run), "--no-progress"], cwd=REPO, capture_output=True,
                              text=True, timeout=HANG_GUARD_S)
        assert more.returncode == 2 and "step-900" in more.stderr and "Traceback" not in more.stderr
        assert len((run / "results.jsonl").read_text().splitlines()) == 1  # nothing added
        r = _cli("probes.entropy", str(run), "--endpoint", url, "--skip-fidelity", "--no-progress")
        assert r.returncode == 2 and "step-900" in r.stderr
    finally:
        p.kill()
        p.wait()


def test_runs_of_two_engines_are_not_pooled():
    def run(kind, server, path):
        h = records.header()
        h["backend"].update(kind=kind, server=server, logprob_mode="raw")
        h["model"].update(backend=kind, served_model="qwen3.5-9b")
        return SimpleNamespace(path=path, header=RunHeader.model_validate(h))
    refuse_mixed_servers("Table 1", [run("vllm", "vllm", "a"), run("openai", "vllm", "b")])  # one engine, two APIs
    with pytest.raises(RunError, match="different engines \\(sglang vs vllm\\)"):
        refuse_mixed_servers("Table 1", [run("sglang", "sglang", "a"), run("vllm", "vllm", "b")])


@pytest.mark.slow
def test_the_launcher_plans_and_starts_vllm_servers_and_clients_read_its_record(tiny_model_dir, tmp_path):
    from tests.test_serving_launch import LAUNCH, STOP, commands, sh

    r = sh([LAUNCH, "--dry-run", "--engine", "vllm", "--gpus", "8", "9b"])
    (cmd,) = commands(r.stdout)
    line = " ".join(cmd)
    assert ("-m vllm.entrypoints.openai.api_server --model Qwen/Qwen3.5-9B --served-model-name qwen3.5-9b "
            "--tensor-parallel-size 4") in line
    assert "--logprobs-mode raw_logprobs --mamba-ssm-cache-dtype float32" in line and "--max-logprobs 20" in line
    assert "--enable-scale-out" in line and "--enable-prompt-tokens-details" in line and "--dtype" not in line
    assert "SGLANG_RETURN_ORIGINAL_LOGPROB" not in line and "--nccl-port" not in line
    assert "clients: --backend vllm --endpoint http://127.0.0.1:30000 --model-dir Qwen/Qwen3.5-9B" in r.stdout
    for flag in (["--logprob-mode", "scaled"], ["--router"], ["--deterministic"], ["--standin", "scripted"]):
        r = sh([LAUNCH, "--dry-run", "--engine", "vllm", *flag, "9b"])
        assert r.returncode == 2 and f"{flag[0]}" in r.stderr and "not offered with --engine vllm" in r.stderr
    # started for real: the stand-in as `vllm serve`, then a run that reads the launcher's record of its mode
    port, run_dir = free_port(), tmp_path / "serve"
    env = {"PYTHONPATH": PYPATH, "QWEN35_9B_PATH": str(tiny_model_dir), "MMCF_STATE_DIR": str(tmp_path / "state")}
    r = sh([LAUNCH, "--engine", "vllm", "--port", str(port), "--serve-dir", str(run_dir), "--timeout", "600",
            "--gpus", "8", "--server-command", f"{sys.executable} {REPO / 'serving' / 'fakes' / 'vllm_server.py'}", "9b"],
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
        s = sh([STOP, "--serve-dir", str(run_dir)])
    assert s.stdout.count("stopped") == 1
