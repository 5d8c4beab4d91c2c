"""smg (SGLang Model Gateway 1.13.0, the real gateway binary the conformance layer installs) in front of loopback
workers: what our requests carry arrives intact, a trajectory's calls stay on one worker (the routing key), and a
worker lost mid-run is survived by the runner's retries. The workers are serving/fakes/sglang_server.py, which
records every body and header it receives (SGLang's real front end behind smg: tests/conformance/test_gateway.py)."""
from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from types import SimpleNamespace

import pytest

from agent.backends.base import Continuation, route, routing_key
from agent.backends.sglang_native import SGLangBackend
from agent.http import RetryPolicy
from agent.run import main as run_main
from agent.rundir import check_run, load_run
from serving.fakes.policy import agent_policy
from serving.fakes.sglang_server import FakeSGLang
from serving.plan import router_command
from tests.conformance.conftest import REPO, SITE, _need_front_end
from tests.test_serving_launch import free_port

#: The fields smg 1.13.0 adds to a /generate body that leaves them out: SGLang's own defaults (GenerateReqInput).
SMG_FILLS = {"no_logs": False, "stream": False, "background": False, "return_entropy": False,
             "return_text_in_logprobs": False, "log_metrics": True, "model": "unknown", "return_bytes": False}


#: every test here starts SGLang's real front end or smg's binary (tens of seconds of set-up)
pytestmark = pytest.mark.slow


class Gateway:
    """``python -m smg.launch_router`` as the launcher starts it (serving/plan.py), over ``workers``."""

    def __init__(self, workers: list[str], log):
        self.port = free_port()
        self.cmd = cmd = router_command(workers, self.port, SimpleNamespace(python=sys.executable, host="127.0.0.1"),
                                        free_port())
        self.p = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{SITE}"},
                                  stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + 120  # a bound, not a timing assumption
        while time.time() < deadline:
            assert self.p.poll() is None, open(log).read()[-3000:]
            try:
                if b"tiny-qwen35" in urllib.request.urlopen(self.url + "/v1/models", timeout=5).read():
                    return
            except OSError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"smg did not serve the model in 120 s: {open(log).read()[-3000:]}")

    def close(self):
        self.p.terminate()
        self.p.wait(30)


@pytest.fixture
def two_workers(tiny_model_dir, tmp_path):
    _need_front_end()  # the conformance layer (smg is in it)
    kw = {"tokenizer_dir": str(tiny_model_dir), "reply": agent_policy, "model_name": "tiny-qwen35"}
    with FakeSGLang(**kw) as a, FakeSGLang(**kw) as b:
        gw = Gateway([a.url, b.url], tmp_path / "smg.log")
        try:
            yield gw, a, b
        finally:
            gw.close()


def test_a_model_with_one_worker_is_served_through_smgs_passthrough_policy(tiny_model_dir, tmp_path):
    """One worker: the launcher asks smg for ``passthrough`` (no cache-aware tree, no sticky keys to keep), and the
    real gateway serves the scoring request through it, the body as the backend sent it."""
    _need_front_end()
    kw = {"tokenizer_dir": str(tiny_model_dir), "reply": agent_policy, "model_name": "tiny-qwen35"}
    with FakeSGLang(**kw) as w:
        gw = Gateway([w.url], tmp_path / "smg.log")
        try:
            assert "--policy passthrough" in " ".join(gw.cmd) and "--routing-key-override" not in gw.cmd

            async def score(url):
                be = SGLangBackend(url, str(tiny_model_dir), policy=RetryPolicy(retries=1, timeout_s=120))
                try:
                    cont = Continuation(ids=be.tok("Red.", add_special_tokens=False)["input_ids"])
                    return await be.score([{"role": "user", "content": "What colour is it?"}], cont)
                finally:
                    await be.aclose()
            via = asyncio.run(score(gw.url))
            sent = w.bodies[-1]
            direct = asyncio.run(score(w.url))
        finally:
            gw.close()
    assert sent["input_ids"] == w.bodies[-1]["input_ids"] and (via.tokens.logprobs == direct.tokens.logprobs).all()


def test_our_generate_fields_and_flat_logprob_fields_arrive_intact(two_workers, tiny_model_dir):
    gw, a, b = two_workers

    async def score(url):
        be = SGLangBackend(url, str(tiny_model_dir), policy=RetryPolicy(retries=1, timeout_s=120))
        try:
            route(("s1", 0))
            cont = Continuation(ids=be.tok("Red, I think.", add_special_tokens=False)["input_ids"])
            return await be.score([{"role": "user", "content": "What colour is it?"}], cont)
        finally:
            await be.aclose()

    via = asyncio.run(score(gw.url))
    (sent,) = [w.bodies[-1] for w in (a, b) if w.bodies]
    direct = asyncio.run(score(a.url))
    ours = a.bodies[-1]  # the body the backend sends a worker directly
    assert {k: sent.get(k) for k in ours} == ours, sorted(set(ours) ^ set(sent))  # every field of ours, as sent
    # and nothing else but SGLang's own defaults for fields we leave out (smg re-serialises the request)
    assert {k: sent[k] for k in set(sent) - set(ours)} == SMG_FILLS
    assert via.request["top_logprobs_wire"] == "flat" and any(k.startswith("return_flat") for k in sent)
    assert (via.tokens.top_ids == direct.tokens.top_ids).all() and (via.tokens.logprobs == direct.tokens.logprobs).all()


def test_our_generate_body_arrives_intact_sampling_params_included(two_workers, tiny_model_dir):
    """smg re-serialises a /generate body and drops the ``sampling_params`` keys it does not know (it does not pass
    them through): the generation body, ``sampling_seed`` and ``skip_special_tokens`` included, must reach the
    worker as the backend sent it (issue 58, smg traps)."""
    from agent.backends.base import SamplingParams

    gw, a, b = two_workers

    async def generate(url):
        be = SGLangBackend(url, str(tiny_model_dir), policy=RetryPolicy(retries=1, timeout_s=120))
        try:
            route(("s1", 0))
            return await be.generate([{"role": "user", "content": "What colour is it?"}],
                                     SamplingParams(max_tokens=8, seed=7, top_logprobs=5))
        finally:
            await be.aclose()

    via = asyncio.run(generate(gw.url))
    (sent,) = [w.bodies[-1] for w in (a, b) if w.bodies]
    asyncio.run(generate(a.url))
    ours = a.bodies[-1]
    assert ours["sampling_params"]["sampling_seed"] == 7 and ours["sampling_params"]["skip_special_tokens"] is False
    assert sent["sampling_params"] == ours["sampling_params"]  # no key dropped, none changed
    assert {k: sent.get(k) for k in ours} == ours and "rid" not in ours  # a rid would override the routing key
    assert via.tokens.ids.tolist() and via.usage.completion_tokens == len(via.tokens)


def test_a_trajectorys_calls_stay_on_one_worker(two_workers, tiny_model_dir, tmp_path):
    gw, a, b = two_workers
    assert run_main(["--method", "react", "--backend", "sglang", "--endpoint", gw.url, "--model-dir",
                     str(tiny_model_dir), "--limit", "6", "--t-max", "4", "--out", str(tmp_path / "run"),
                     "--no-progress"]) == 0
    on_a, on_b = set(a.routing_keys) - {None}, set(b.routing_keys) - {None}
    units = {routing_key(ln.key) for ln in load_run(tmp_path / "run").index}
    assert on_a | on_b == units and not on_a & on_b  # every trajectory on exactly one worker
    # smg strips a trailing _t<n> / _r<n> from a key (two trajectories would share one), and a body's rid
    # overrides the header: our keys are mmcf-<32 hex>, and no body carries a rid
    assert all(re.fullmatch(r"mmcf-[0-9a-f]{32}", k) for k in units)
    assert not any("rid" in body for w in (a, b) for body in w.bodies)
    assert len(a.bodies) + len(b.bodies) >= sum(ln.n_calls for ln in load_run(tmp_path / "run").index)


@pytest.mark.slow
def test_a_worker_lost_mid_run_is_survived(two_workers, tiny_model_dir, tmp_path):
    gw, a, b = two_workers
    killed, lock = [], threading.Lock()

    def third_request_kills(w) -> bool:  # whichever worker smg gives work first dies on its third request
        with lock:
            if not killed and len(w.bodies) >= 3:
                killed.append(w)
            return bool(killed) and killed[0] is w

    a.crash_when = b.crash_when = third_request_kills
    run = tmp_path / "run"
    assert run_main(["--method", "react", "--backend", "sglang", "--endpoint", gw.url, "--model-dir",
                     str(tiny_model_dir), "--limit", "6", "--t-max", "4", "--out", str(run), "--no-progress"]) == 0
    assert killed and check_run(run).complete
    lines = load_run(run).index
    assert len(lines) == 6 and {ln.status for ln in lines} <= {"ok", "no_answer"}
    # the lost worker's trajectories finished on the other one
    lost = set(killed[0].routing_keys) - {None}
    assert lost and lost <= {routing_key(ln.key) for ln in lines if ln.status == "ok"}
