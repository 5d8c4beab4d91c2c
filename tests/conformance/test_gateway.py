"""Many nodes behind one gateway (serving/gateway.py), on 127.0.0.1: each "node" is a launcher run directory of
stand-in servers (serving/launch_qwen35.sh with the loopback SGLang), the gateway is sglang-router's real binary
(from the conformance layer), one per model."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

import pytest

from tests.conftest import REPO
from tests.conformance.conftest import _need_front_end
from tests.test_serving_launch import LAUNCH, STOP, _standin_env, free_port, sh


def _gateway(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "serving.gateway", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": str(REPO)})


def _launch(run_dir, *args):
    r = sh([LAUNCH, "--advertise-host", "127.0.0.1", "--run-dir", str(run_dir), "--timeout", "60", *map(str, args)],
           env=_standin_env())
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads((run_dir / "endpoints.json").read_text())


def _post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


@pytest.fixture
def nodes(tmp_path):
    _need_front_end()
    a, b, c = tmp_path / "nodeA", tmp_path / "nodeB", tmp_path / "nodeC"
    try:
        ea = _launch(a, "--port", free_port(), "9b", "27b")   # node A: one 9b, one 27b
        eb = _launch(b, "--port", free_port(), "9b")          # node B: another 9b
        ec = _launch(c, "--port", free_port(), "--logprobs", "raw", "9b")  # node C: a 9b launched otherwise
        yield tmp_path, (a, ea), (b, eb), (c, ec)
    finally:
        for d in (a, b, c):
            if d.exists():
                sh([STOP, "--run-dir", str(d)])


def test_one_gateway_per_model_over_several_nodes(nodes):
    tmp, (a, ea), (b, eb), (c, ec) = nodes
    gw, port, prom = tmp / "gw", free_port(), free_port()
    while prom in (port, port + 1) or prom + 1 in (port, port + 1):
        prom = free_port()
    r = _gateway(a, b, "--run-dir", gw, "--port", port, "--prometheus-port", prom)
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        eps = json.loads((gw / "endpoints.json").read_text())
        routers = {e["served_model"]: e for e in eps if e["kind"] == "router"}
        assert set(routers) == {"qwen3.5-9b", "qwen3.5-27b"}  # one gateway per model, distinct ports
        assert {routers["qwen3.5-27b"]["url"], routers["qwen3.5-9b"]["url"]} == \
            {f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"}
        nine = sorted(e["url"] for e in ea + eb if e["served_model"] == "qwen3.5-9b")
        assert sorted(routers["qwen3.5-9b"]["router_of"]) == nine and len(routers["qwen3.5-9b"]["nodes"]) == 2
        cmd = (gw / f"router-{port + 1}.cmd").read_text()
        assert "sglang_router.launch_router --worker-urls" in cmd and "--policy cache_aware" in cmd
        # the real router serves each model and answers through a worker of that model only
        for model, e in routers.items():
            got = json.load(urllib.request.urlopen(e["url"] + "/v1/models", timeout=30))
            assert [m["id"] for m in got["data"]] == [model]
            out = _post(e["url"] + "/generate", {"text": "hello", "sampling_params": {"max_new_tokens": 4}})
            assert out["meta_info"]["completion_tokens"] >= 1
        # a run or probe through the gateway knows the GPUs behind one request (one TP=4 worker group)
        from serving.endpoints import gpus_behind

        assert gpus_behind(routers["qwen3.5-9b"]["url"], serving_dir=gw) == 4
        # the smoke test through the gateway
        chk = subprocess.run([sys.executable, "-m", "serving.check", "--endpoint", routers["qwen3.5-27b"]["url"],
                              "--json", "--max-tokens", "8"], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert chk.returncode == 0, chk.stdout + chk.stderr
    finally:
        s = sh([STOP, "--run-dir", str(gw)])
    assert s.stdout.count("stopped") == 2  # the routers; the nodes' servers are the nodes' to stop
    for e in ea + eb:
        urllib.request.urlopen(e["url"] + "/health", timeout=10).read()


def test_the_gateway_refuses_what_would_mix_numbers_or_lose_a_server(nodes):
    tmp, (a, ea), (b, eb), (c, ec) = nodes
    port = free_port()
    # servers of one model launched with different logprob semantics
    r = _gateway(a, c, "--run-dir", tmp / "g1", "--port", port, "--dry-run")
    assert r.returncode == 2 and "differ in logprob_mode" in r.stderr, r.stderr
    # one node's record given twice under two names claims the same URLs
    (tmp / "copy").mkdir()
    (tmp / "copy" / "endpoints.json").write_text((b / "endpoints.json").read_text())
    r = _gateway(a, b, tmp / "copy", "--dry-run")
    assert r.returncode == 2 and "recorded by two nodes" in r.stderr and "--advertise-host" in r.stderr
    # a node that went away: refused, naming it; --skip-unhealthy leaves it out and says so
    assert sh([STOP, "--run-dir", str(b)]).returncode == 0
    (b / "endpoints.json").write_text(json.dumps([{**e, "status": "running"} for e in eb]))  # a stale record
    r = _gateway(a, b, "--dry-run")
    assert r.returncode == 2 and "not answering" in r.stderr and str(b / "endpoints.json") in r.stderr
    r = _gateway(a, b, "--dry-run", "--skip-unhealthy")
    assert r.returncode == 0 and "left out" in r.stderr
    assert "qwen3.5-9b: router" in r.stdout and "over 1 server(s) on 1 node(s)" in r.stdout
    r = _gateway(tmp / "nowhere")
    assert r.returncode == 2 and "no such file" in r.stderr
