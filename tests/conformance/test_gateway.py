"""Many nodes behind one gateway (serving/gateway.py), on 127.0.0.1: each "node" is a launcher run directory of
stand-in servers (serving/launch_qwen35.sh with the loopback SGLang), the gateway is smg's real binary (SGLang
Model Gateway 1.13.0, from the conformance layer), one per model."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.request

import pytest

from tests.conformance.conftest import _need_front_end
from tests.conftest import REPO
from tests.guards import HANG_GUARD_S
from tests.test_serving_launch import LAUNCH, STANDIN_NODE, STOP, free_port, sh

#: every test here starts SGLang's real front end or smg's binary (tens of seconds of set-up)
pytestmark = pytest.mark.slow


def _gateway(*args, timeout=HANG_GUARD_S):
    return subprocess.run([sys.executable, "-m", "serving.gateway", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": str(REPO)})


def _launch(run_dir, *args):
    r = sh([LAUNCH, "--advertise-host", "127.0.0.1", "--serve-dir", str(run_dir), "--timeout", "60", *STANDIN_NODE,
            *map(str, args)])
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads((run_dir / "endpoints.json").read_text())


def _post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=HANG_GUARD_S) as r:
        return json.loads(r.read())


@pytest.fixture
def nodes(tmp_path):
    _need_front_end()
    a, b, c = tmp_path / "nodeA", tmp_path / "nodeB", tmp_path / "nodeC"
    try:
        ea = _launch(a, "--port", free_port(), "9b", "27b")   # node A: one 9b, one 27b
        eb = _launch(b, "--port", free_port(), "9b")          # node B: another 9b
        ec = _launch(c, "--port", free_port(), "--logprob-mode", "raw", "9b")  # node C: a 9b launched otherwise
        yield tmp_path, (a, ea), (b, eb), (c, ec)
    finally:
        for d in (a, b, c):
            if d.exists():
                sh([STOP, "--serve-dir", str(d)])


@pytest.mark.slow
def test_one_gateway_per_model_over_several_nodes(nodes):
    tmp, (a, ea), (b, eb), (c, ec) = nodes
    gw, port, prom = tmp / "gw", free_port(), free_port()
    while prom in (port, port + 1) or prom + 1 in (port, port + 1):
        prom = free_port()
    r = _gateway(a, b, "--serve-dir", gw, "--port", port, "--prometheus-port", prom)
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
        assert "smg.launch_router --worker-urls" in cmd and "--policy cache_aware --routing-key-override" in cmd
        # the real router serves each model and answers through a worker of that model only
        for model, e in routers.items():
            got = json.load(urllib.request.urlopen(e["url"] + "/v1/models", timeout=HANG_GUARD_S))
            assert [m["id"] for m in got["data"]] == [model]
            out = _post(e["url"] + "/generate", {"text": "hello", "sampling_params": {"max_new_tokens": 4}})
            assert out["meta_info"]["completion_tokens"] >= 1
        # a run or probe through the gateway knows the GPUs behind one request (one TP=4 worker group)
        from serving.endpoints import gpus_behind

        assert gpus_behind(routers["qwen3.5-9b"]["url"], serving_dir=gw) == 4
        # ... and the GPUs a run through it holds: both 9b workers' (what held GPU-seconds count)
        from serving.endpoints import gpus_held

        assert gpus_held(routers["qwen3.5-9b"]["url"], serving_dir=gw) == 8
        assert gpus_held(routers["qwen3.5-27b"]["url"], serving_dir=gw) == 4
        # the smoke test through the gateway
        chk = subprocess.run([sys.executable, "-m", "serving.check", "--endpoint", routers["qwen3.5-27b"]["url"],
                              "--json", "--max-tokens", "8"], cwd=REPO, capture_output=True, text=True, timeout=HANG_GUARD_S)
        assert chk.returncode == 0, chk.stdout + chk.stderr
    finally:
        s = sh([STOP, "--serve-dir", str(gw)])
    assert s.stdout.count("stopped") == 2  # the routers; the nodes' servers are the nodes' to stop
    for e in ea + eb:
        urllib.request.urlopen(e["url"] + "/health", timeout=10).read()


def test_the_gateway_refuses_what_would_mix_numbers_or_lose_a_server(nodes):
    tmp, (a, ea), (b, eb), (c, ec) = nodes
    port = free_port()
    # servers of one model launched with different logprob semantics
    r = _gateway(a, c, "--serve-dir", tmp / "g1", "--port", port, "--dry-run")
    assert r.returncode == 2 and "differ in logprob_mode" in r.stderr, r.stderr
    # one node's record given twice under two names claims the same URLs
    (tmp / "copy").mkdir()
    (tmp / "copy" / "endpoints.json").write_text((b / "endpoints.json").read_text())
    r = _gateway(a, b, tmp / "copy", "--dry-run")
    assert r.returncode == 2 and "recorded by two nodes" in r.stderr and "--advertise-host" in r.stderr
    # a node that went away: refused, naming it; --skip-unhealthy leaves it out and says so
    assert sh([STOP, "--serve-dir", str(b)]).returncode == 0
    (b / "endpoints.json").write_text(json.dumps([{**e, "status": "running"} for e in eb]))  # a stale record
    r = _gateway(a, b, "--dry-run")
    assert r.returncode == 2 and "not answering" in r.stderr and str(b / "endpoints.json") in r.stderr
    r = _gateway(a, b, "--dry-run", "--skip-unhealthy")
    assert r.returncode == 0 and "left out" in r.stderr
    assert "qwen3.5-9b: router" in r.stdout and "over 1 server(s) on 1 node(s)" in r.stdout
    r = _gateway(tmp / "nowhere")
    assert r.returncode == 2 and "no such file" in r.stderr


async def _score_both_ways(url, tiny_model_dir) -> list[str]:
    import numpy as np

    from agent.backends.base import Continuation, route
    from agent.backends.sglang_native import SGLangBackend
    from agent.http import RetryPolicy

    route(("scored", 0))  # both requests on one worker (smg's routing key), as a trajectory's are

    msgs = [{"role": "user", "content": [{"type": "text", "text": "What colour is it?"}]}]
    out, arrays = [], []
    for flat in (True, False):
        b = SGLangBackend(url, str(tiny_model_dir), policy=RetryPolicy(retries=1, timeout_s=300), flat_logprobs=flat)
        try:
            cont = Continuation(ids=b.tok("Red, I think.", add_special_tokens=False)["input_ids"])
            s = await b.score(msgs, cont)
        finally:
            await b.aclose()
        out.append(s.request["top_logprobs_wire"])
        arrays.append((s.tokens.top_ids, s.tokens.top_logprobs, s.tokens.logprobs))
    (ids_f, top_f, lp_f), (ids_n, top_n, lp_n) = arrays
    # the same tokens; the same values to float32 precision (the flat arrays are float32; the scripted stand-in's
    # nested values are Python floats)
    assert np.array_equal(ids_f, ids_n)
    assert np.allclose(top_f, top_n, rtol=0, atol=1e-6, equal_nan=True) and np.allclose(lp_f, lp_n, rtol=0, atol=1e-6)
    return out


@pytest.mark.slow
def test_the_launchers_real_topology_then_a_run_through_the_gateway_over_it(sglang_front_end_built, tiny_model_dir,
                                                                            tmp_path):
    """One launch of the real topology on CPU (SGLang's front end with the scripted scheduler stand-in): a 9b
    server behind the launcher's real smg router, every port distinct, the smoke check through the router. Then
    that server recorded as a node, the gateway's real router in front, and a ReAct run, the fidelity check and
    the cost ledger through it; finally stop.sh stops everything. (One launch for both, one server: each SGLang
    server costs ~26 s of CPU to start. Several replicas on distinct ports are launched over lighter stand-ins in
    tests/test_serving_launch.py, and one gateway per model over several nodes, with distinct metrics ports and
    the GPUs of every node counted, against the real smg in test_one_gateway_per_model_over_several_nodes.)"""
    from agent.run import main as run_main
    from agent.rundir import check_run, load_run
    from probes.fidelity import main as fidelity_main
    from serving.check import main as check_main
    from serving.processes import alive

    ports: list[int] = []
    while len(ports) < 4:  # four distinct ports: the server's, the router's, its metrics', the NCCL one
        ports += [p for p in [free_port()] if p not in ports]
    port, rport, prom, nccl = ports
    serve, gw = tmp_path / "serve", tmp_path / "gw"
    env = {"PYTHON": sys.executable, "MMCF_TINY_MODEL_DIR": str(tiny_model_dir)}
    r = sh([LAUNCH, "--standin", "scripted", "--router", "--host", "127.0.0.1", "--advertise-host", "127.0.0.1",
            "--port", str(port), "--router-port", str(rport), "--prometheus-port", str(prom), "--nccl-port", str(nccl),
            "--serve-dir", str(serve), "--timeout", "600", "9b"], env=env, timeout=900)
    try:
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        ports_line = next(ln for ln in r.stdout.splitlines() if ln.startswith("ports: "))
        for p in (port, nccl, rport, prom):
            assert f" {p}" in ports_line
        entries = json.loads((serve / "endpoints.json").read_text())
        routers = [e for e in entries if e["kind"] == "router"]
        servers = [e for e in entries if e["kind"] != "router"]
        assert [e["served_model"] for e in routers] == ["qwen3.5-9b"] and routers[0]["prometheus_port"] == prom
        assert routers[0]["router_of"] == [e["url"] for e in servers] and len(servers) == 1
        for e in routers:  # the toolkit's own smoke check through each real router
            assert check_main(["--endpoint", e["url"], "--backend", "sglang", "--model-dir", str(tiny_model_dir)]) == 0
        pids = [e["pid"] for e in entries]

        nines = [e for e in servers if e["served_model"] == "qwen3.5-9b"]
        (tmp_path / "nodeA").mkdir()  # the 9b server as a node's record
        (tmp_path / "nodeA" / "endpoints.json").write_text(json.dumps(nines))
        g = _gateway(tmp_path / "nodeA", "--serve-dir", gw, "--port", free_port(), "--prometheus-port", free_port())
        assert g.returncode == 0, g.stdout + g.stderr
        (router,) = [e for e in json.loads((gw / "endpoints.json").read_text()) if e["kind"] == "router"]
        assert sorted(router["router_of"]) == sorted(e["url"] for e in nines)
        run = tmp_path / "run"
        assert run_main(["--method", "react", "--backend", "sglang", "--endpoint", router["url"], "--model-dir",
                         str(tiny_model_dir), "--limit", "2", "--t-max", "3", "--max-tokens", "64", "--out", str(run),
                         "--no-progress"]) == 0
        assert check_run(run).complete and len(load_run(run).index) == 2
        led = json.loads((run / "ledger.json").read_text())
        (m,) = led["models"].values()
        assert m["calls"] >= 2 and m["request_gpu_seconds"] is not None  # the GPUs behind the gateway are known
        # the run held the GPUs of every worker behind the gateway
        (gpus,) = [len(e["gpus"].split(",")) for e in nines]
        assert m["held_gpu_seconds"] == pytest.approx(led["span_s"] * gpus, abs=0.01)
        # the serving-fidelity check through the gateway: every check but the local reference
        rc = fidelity_main([str(run), "--backend", "sglang", "--endpoint", router["url"], "--model-dir",
                            str(tiny_model_dir), "--samples", "1"])
        rep = json.loads((run / "probes" / "fidelity" / "fidelity.json").read_text())
        assert rc == 0, rep
        assert all(rep["checks"][k]["ok"] and rep["checks"][k]["n_tokens"] > 0 for k in ("warm", "cold", "paths")), rep
        assert rep["checks"]["paths"]["by"] == ["ids"]  # smg passes the chat path's meta_info: compared by token id
        # teacher-forced scoring through the gateway: smg passes SGLang's flat top-logprob fields on to the worker
        # (tests/conformance/test_smg.py), and the scores are the same as asked for nested lists
        assert asyncio.run(_score_both_ways(router["url"], tiny_model_dir)) == ["flat", "nested"]
    finally:
        sh([STOP, "--serve-dir", str(gw)])
        s = sh([STOP, "--serve-dir", str(serve)])
    assert s.returncode == 0 and s.stdout.count(": stopped (pid") == 2, s.stdout
    assert not any(alive(p) for p in pids)
    assert {e["status"] for e in json.loads((serve / "endpoints.json").read_text())} == {"stopped"}
