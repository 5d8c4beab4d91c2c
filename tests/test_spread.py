"""Probes over several model servers (agent/backends/spread.py): each trajectory stays on one server, the work
is shared, the run's own servers are the default, and servers of different models are refused."""
from __future__ import annotations

import json

import pytest

from agent.backends.scripted import ScriptedBackend
from agent.backends.spread import Spread, pin
from agent.preflight import PreflightError, model_identity
from agent.run import main as run_main
from probes.entropy import main as entropy_main
from probes.entropy import probe_run
from serving.fakes.policy import agent_policy
from serving.fakes.sglang_server import FakeSGLang
from tests.test_probe_entropy import _run, planted, policy


@pytest.mark.slow
async def test_each_trajectory_keeps_one_server_and_both_get_work(tmp_path):
    await _run(tmp_path, trials=4)  # 3 samples x 4 trials, 3 image-bearing steps each
    a, b = (ScriptedBackend([policy] * 100, top_fn=planted) for _ in range(2))
    spread = Spread([a, b])
    res = await probe_run(tmp_path / "run", backend=spread, progress=False, concurrency=4)
    assert len(res["steps"]) == 36 and len(spread.keys) == 12  # 12 trajectories, each given one server
    on = [sum(1 for i in spread.keys.values() if i == j) for j in (0, 1)]
    # each server answered exactly the 3 steps of each trajectory it was given, and both were given some
    assert [len(a.calls), len(b.calls)] == [3 * on[0], 3 * on[1]] and min(on) >= 2


def test_pin_is_per_task_and_unpinned_calls_go_to_the_least_busy():
    import asyncio

    s = Spread([ScriptedBackend(["x"]), ScriptedBackend(["y"])])
    assert s.assign(("q", 0)) == 0 and s.assign(("q", 1)) == 1 and s.assign(("q", 0)) == 0

    async def where(key):
        pin(s, key)
        await asyncio.sleep(0)
        return s._pick()

    async def go():
        return await asyncio.gather(where(("q", 0)), where(("q", 1)), where(("q", 0)))

    assert asyncio.run(go()) == [0, 1, 0]
    assert s._pick() in (0, 1)  # no pin in this context
    pin(ScriptedBackend(["z"]), "k")  # a single backend: a no-op


async def test_servers_of_different_models_are_refused():
    s = Spread([ScriptedBackend(["x"], model="m1"), ScriptedBackend(["x"], model="m2")])
    with pytest.raises(PreflightError, match="serve different models"):
        await model_identity(s)
    ok = await model_identity(Spread([ScriptedBackend(["x"], model="m1"), ScriptedBackend(["x"], model="m1")]))
    assert ok["served_model"] == "m1"


def test_the_probe_defaults_to_the_runs_servers_and_spreads_over_them(tmp_path, capsys):
    """A run recorded over two servers: python -m probes.entropy with no backend flags probes over both, each
    trajectory's requests on one of them."""
    with FakeSGLang(reply=agent_policy) as s1, FakeSGLang(reply=agent_policy) as s2:
        assert run_main(["--method", "react", "--backend", "openai", "--endpoint", s1.url, "--endpoint", s2.url,
                         "--benchmark", "demo", "--limit", "4", "--t-max", "4", "--out", str(tmp_path / "r"),
                         "--no-progress"]) == 0
        n1, n2 = len(s1.bodies), len(s2.bodies)
        assert entropy_main([str(tmp_path / "r"), "--no-progress"]) == 0
        probe = {"s1": s1.bodies[n1:], "s2": s2.bodies[n2:]}
    assert probe["s1"] and probe["s2"]  # both servers probed
    where = {}
    for name, bodies in probe.items():
        for body in bodies:
            q = json.dumps(body["messages"][1]["content"][-1])  # the sample's question
            where.setdefault(q, set()).add(name)
    assert len(where) == 4 and all(len(v) == 1 for v in where.values())  # a trajectory never changes server
    assert "error:" not in capsys.readouterr().err


class FakeRouterBackend:
    """Only what serving_hardware reads of a backend: its URL."""

    def __init__(self, url):
        self.url = url + "/generate"


@pytest.mark.slow
def test_gpu_seconds_come_from_the_launchers_endpoints_and_add_up_over_sessions(tmp_path, monkeypatch):
    """probe.json's cost: the hardware held (wall time x servers x GPUs behind each, read from the launcher's
    endpoints.json: a TP=4 server, a router counted by its workers' group), summed over resumed sessions; GPUs
    unknown -> None, never 0."""
    from probes.session import record_session, serving_hardware
    from serving.endpoints import gpus_behind

    serve = tmp_path / "serve"
    serve.mkdir()
    monkeypatch.setenv("MMCF_STATE_DIR", str(tmp_path / "state"))
    with FakeSGLang(reply=agent_policy) as s1, FakeSGLang(reply=agent_policy) as s2:
        (serve / "endpoints.json").write_text(json.dumps([
            {"url": s1.url, "kind": "server", "gpus": "0,1,2,3"}, {"url": s2.url, "kind": "server", "gpus": "4,5,6,7"},
            {"url": "http://127.0.0.1:9", "kind": "router", "router_of": [s1.url, s2.url], "gpus": ""}]))
        assert gpus_behind(s1.url + "/v1", serve) == 4 and gpus_behind("http://localhost:9/", serve) == 4
        assert gpus_behind("http://elsewhere:1", serve) is None and gpus_behind(s1.url) is None  # not remembered
        from serving.endpoints import gpus_held

        # what a run through the router holds: both workers' GPUs, though a request runs on one group
        assert gpus_held("http://127.0.0.1:9", serve) == 8 and gpus_held(s2.url, serve) == 4
        hw_router = serving_hardware(FakeRouterBackend("http://127.0.0.1:9"), serving_dir=serve)
        assert hw_router["gpus_per_server"] == 4 and hw_router["gpus_held"] == 8
        assert record_session(None, hw_router, 0.0, 10.0, 1)["gpu_seconds"] == 80.0
        assert run_main(["--method", "react", "--backend", "openai", "--endpoint", s1.url, "--endpoint", s2.url,
                         "--benchmark", "demo", "--limit", "2", "--t-max", "3", "--out", str(tmp_path / "r"),
                         "--no-progress"]) == 0
        assert entropy_main([str(tmp_path / "r"), "--no-progress", "--limit", "1", "--serve-dir", str(serve)]) == 0
        probe = tmp_path / "r" / "probes" / "entropy-regenerate" / "probe.json"
        c1 = json.loads(probe.read_text())["cost"]
        assert entropy_main([str(tmp_path / "r"), "--no-progress", "--serve-dir", str(serve)]) == 0  # resumes
        c2 = json.loads(probe.read_text())["cost"]
        # the chat path cannot score: the fidelity check is skipped, and the probe says so
        assert json.loads(probe.read_text())["fidelity"] == {"skipped": "the backend cannot score recorded tokens (openai)"}
    assert [s["servers"] for s in c2["sessions"]] == [2, 2] and {s["gpus_per_server"] for s in c2["sessions"]} == {4}
    assert c2["sessions"][0] == c1["sessions"][0] and c2["sessions"][1]["units"] > 0
    assert c2["gpu_seconds"] == round(sum(s["wall_s"] for s in c2["sessions"]) * 2 * 4, 1) > 0
    # no record of the GPUs: unknown, and it stays unknown once a session is
    hw = serving_hardware(ScriptedBackend(["x"]))
    assert hw == {"servers": 0, "gpus_per_server": None, "gpus_from": None, "gpus_held": None}
    c3 = record_session(probe, hw, 0.0, 1.0, 1)
    assert c3["gpu_seconds"] is None and len(c3["sessions"]) == 3
