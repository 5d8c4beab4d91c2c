"""The launcher's server and gateway command lines parse under SGLang's and smg's own argument parsers."""
from __future__ import annotations

import pytest

from serving.launch import build_parser, plan, router_command, router_plan


def _args(*argv):
    a = build_parser().parse_args(list(argv))
    a.python = "python3"
    a.models = a.models or ["9b", "27b"]
    return a


@pytest.mark.parametrize("argv", [(), ("--logprob-mode", "raw", "--deterministic", "35b-a3b"),
                                  ("--tp", "8", "--gpu-groups", "0,1,2,3,4,5,6,7", "27b")])
def test_server_command_lines_parse_under_sglangs_parser(sglang, monkeypatch, argv):
    monkeypatch.setenv("SGLANG_EXTRA_ARGS", "--log-level info")
    a = _args("--gpus", "8", *argv)
    for s in plan(a):
        assert s.cmd[:3] == ["python3", "-m", "sglang.launch_server"]
        res = sglang.ask("server_args", argv=s.cmd[3:])
        assert res["ok"], res
        got = res["args"]
        assert got["tp_size"] == a.tp and got["reasoning_parser"] == "qwen3" and got["port"] == s.port
        assert got["served_model_name"] == s.served and got["mem_fraction_static"] is None  # SGLang decides
        assert got["enable_deterministic_inference"] is a.deterministic and got["log_level"] == "info"
        assert got["mamba_radix_cache_strategy"] == "extra_buffer"  # pinned (serving/plan.py)
        assert got["nccl_port"] == s.nccl_port == a.port + 1000 + plan(a).index(s)


def test_gateway_command_lines_parse_under_smgs_parser(sglang, monkeypatch):
    a = _args("--router", "9b", "9b", "27b")
    routers = router_plan(a, plan(a))
    assert [m for m, _, _, _ in routers] == ["qwen3.5-9b", "qwen3.5-27b"]
    proms = set()
    for _, port, urls, prom in routers:
        cmd = router_command(urls, port, a, prom)
        res = sglang.ask("router_args", argv=cmd[3:])
        assert res["ok"], res
        assert res["worker_urls"] == urls and res["port"] == port
        if len(urls) > 1:  # sticky sessions: a trajectory's routing key pins one worker
            assert res["policy"] == "cache_aware" and res["routing_key_override"] is True
        else:  # one worker: nothing to balance, a hop only
            assert res["policy"] == "passthrough" and res["routing_key_override"] is False
        proms.add(res["prometheus_port"])
    assert [len(urls) for _, _, urls, _ in routers] == [2, 1]  # both policies were read by smg's parser
    # each gateway its own metrics port (one default for both: the second could not bind it)
    assert proms == {29000, 29001}


def test_the_radix_cache_rule_for_deterministic_inference_is_sglangs(sglang):
    """serving/plan.py's list is SGLang's own; the launcher says when --deterministic turns the cache off."""
    from serving.plan import RADIX_DETERMINISTIC_BACKENDS

    out = sglang.ask("radix_deterministic")
    assert out["ok"] and tuple(out["backends"]) == RADIX_DETERMINISTIC_BACKENDS, out


@pytest.mark.parametrize("cap, extra, warned", [("9.0", "", False), ("10.0", "", True), ("10.0", "--attention-backend triton", False),
                                                ("9.0", "--attention-backend=flashinfer", True)])
def test_the_launcher_warns_when_deterministic_inference_turns_the_cache_off(monkeypatch, cap, extra, warned):
    from serving.plan import radix_cache_warning

    monkeypatch.setenv("SGLANG_EXTRA_ARGS", extra)
    msg = radix_cache_warning(_args("--deterministic", "--gpu-compute-cap", cap))
    assert (msg is not None) == warned and (not warned or "turns the radix cache off" in msg)
    assert radix_cache_warning(_args()) is None


@pytest.mark.parametrize("vision", [{"depth": 2, "hidden_size": 32},                       # the embedded tiny model's
                                    {"depth": 27, "hidden_size": 1152},                    # Qwen3.5's encoder
                                    {"num_hidden_layers": 48, "hidden_size": 1664}])       # a large ViT
def test_the_estimate_takes_sglangs_own_headroom_for_the_vision_encoder(sglang, vision):
    from serving.plan import vlm_headroom

    res = sglang.ask("vlm_mem_fraction", frac=0.855, vision=vision, gpu_mem=91_552)
    assert res["ok"], res
    assert abs(vlm_headroom(0.855, vision) - res["frac"]) < 1e-12
