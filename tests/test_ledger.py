"""The cost ledger (agent/rundir/ledger.py) equals hand counts on a small run with live (fake) APIs behind a served model;
unknown prices stay unknown; the dry-run projection; the ledger beside Table 4."""
from __future__ import annotations

import json

import pytest

from agent.judge import main as judge_main
from agent.ledger import main as ledger_main
from agent.run import main as run_main
from agent.rundir import load_run
from agent.rundir.ledger import PAPER_TABLE4, compute_ledger, load_prices
from serving.fakes.policy import agent_policy
from serving.fakes.sglang_server import FakeSGLang

PRICES = {"models": {"fake-qwen3.5": {"input_per_1m": 1.0, "output_per_1m": 2.0}},
          "tools": {"search": {"per_call": 0.001}, "visit": {"per_call": 0.002}, "lens_search": {"per_call": 0.003}},
          "gpu_hour": {"price": 2.5, "source": "test"}}


def _hand(run_dir) -> dict:
    """The same numbers counted from the full lines' events, not from the summaries the ledger reads."""
    r = load_run(run_dir)
    h = {"calls": 0, "prompt": 0, "cached": 0, "completion": 0, "latency": 0.0, "tools": {}, "t0": 1e30, "t1": 0}
    for s in r.index:
        ln = r.full(s).as_recorded()
        h["t0"], h["t1"] = min(h["t0"], ln["started"]), max(h["t1"], ln["finished"])
        for e in ln["events"]:
            if e["type"] == "llm_call":
                h["calls"] += 1
                h["prompt"] += e["usage"]["prompt_tokens"]
                h["cached"] += e["usage"]["cached_tokens"]
                h["completion"] += e["usage"]["completion_tokens"]
                h["latency"] += e["latency_s"]
            elif e["type"] == "tool_call":
                t = h["tools"].setdefault(e["name"], [0, 0, 0])
                t[0] += 1
                t[1] += bool(e["cache_hit"])
                t[2] += e["paid_calls"]
    return h


def test_the_ledger_equals_hand_counts(tmp_path, live_web, capsys):
    serve = tmp_path / "serve"
    serve.mkdir()
    with FakeSGLang(reply=agent_policy, latency_s=0.02) as srv:
        (serve / "endpoints.json").write_text(json.dumps([{"url": srv.url, "gpus": "0,1,2,3", "kind": "server",
                                                           "served_model": "fake-qwen3.5", "status": "running"}]))
        run = tmp_path / "run"
        assert run_main(["--method", "react", "--backend", "openai", "--endpoint", srv.url, "--tools", "live",
                         "--limit", "3", "--trials", "2", "--seed", "1", "--concurrency", "1", "--out", str(run),
                         "--no-progress"]) == 0
        assert (run / "ledger.json").exists()  # the runner writes one after every invocation
        assert judge_main([str(run), "--judge-endpoint", srv.url, "--judge-model", "fake-qwen3.5",
                           "--no-progress"]) in (0, 1)
        web_requests = len(live_web.log)
    capsys.readouterr()
    (tmp_path / "prices.json").write_text(json.dumps(PRICES))
    assert ledger_main([str(run), "--serve-dir", str(serve), "--prices", str(tmp_path / "prices.json")]) == 0
    printed = capsys.readouterr().out
    led = json.loads((run / "ledger.json").read_text())
    h = _hand(run)
    m = led["models"]["fake-qwen3.5"]
    assert (m["calls"], m["prompt_tokens"], m["cached_tokens"], m["completion_tokens"]) == \
        (h["calls"], h["prompt"], h["cached"], h["completion"])
    assert m["request_gpu_seconds"] == pytest.approx(h["latency"] * 4, abs=1e-2) and m["request_gpu_seconds"] > 0
    assert m["held_gpu_seconds"] == pytest.approx((h["t1"] - h["t0"]) * 4, abs=1e-2)
    assert {k: [t["calls"], t["cached"], t["paid_calls"]] for k, t in led["tools"].items()} == h["tools"]
    # every paid call reached the (fake) paid API once; the second trial found the first one's results cached
    assert sum(t["paid_calls"] for t in led["tools"].values()) == web_requests > 0
    assert led["tools"]["search"]["cached"] > 0
    # money: a model with a token price by its tokens (here the agent's and the judge's), tools per paid call
    (j,) = led["judges"].values()
    assert j["calls"] == 6 and j["prompt_tokens"] == 17 * 6  # the fake reports 17 prompt tokens per chat call
    tools = sum(t["paid_calls"] * PRICES["tools"][k]["per_call"] for k, t in led["tools"].items())
    want = ((h["prompt"] - h["cached"]) * 1.0 + h["completion"] * 2.0) / 1e6 + tools \
        + (j["prompt_tokens"] * 1.0 + j["completion_tokens"] * 2.0) / 1e6
    assert led["total_money"] == pytest.approx(want, abs=2e-6) and not led["unknown"]
    assert "total: $" in printed
    # a self-hosted model (no token price) by held GPU-hours; the judge then has no price: the total is unknown
    gpu_only = {**PRICES, "models": {}}
    led2 = compute_ledger(run, prices={**load_prices(), **gpu_only, "models": {}}, serving_dir=serve)
    assert led2["models"]["fake-qwen3.5"]["money"] == pytest.approx(m["held_gpu_seconds"] / 3600 * 2.5, abs=1e-6)
    assert led2["total_money"] is None and any("judge" in u for u in led2["unknown"])
    # without prices and without the GPUs: unknown, never 0
    bare = compute_ledger(run, prices=load_prices(), serving_dir=tmp_path / "nowhere")
    assert bare["total_money"] is None and bare["tools"]["search"]["money"] is None
    assert any("search: no price" in u for u in bare["unknown"])
    # the ledger beside Table 4
    from analysis.tables import ledger_table

    row = ledger_table([run]).iloc[0]
    assert row["prompt tokens"] == h["prompt"] and row["paid tool calls"] == web_requests


def test_dry_run_projects_from_a_pilot_or_the_paper_and_writes_nothing(tmp_path, capsys):
    pilot = tmp_path / "pilot"
    assert run_main(["--method", "react", "--backend", "scripted", "--limit", "4", "--out", str(pilot),
                     "--no-progress"]) == 0
    led = json.loads((pilot / "ledger.json").read_text())
    capsys.readouterr()
    out = tmp_path / "planned"
    # 4 samples x 3 trials from a 4-unit pilot: three times the pilot's tokens and tool calls
    assert run_main(["--method", "react", "--backend", "scripted", "--limit", "4", "--trials", "3", "--out", str(out),
                     "--dry-run", "--pilot", str(pilot), "--tool-cache", str(pilot / "tools.sqlite")]) == 0
    text = capsys.readouterr().out
    m = led["models"]["scripted-demo"]
    assert f"prompt tokens {3 * m['prompt_tokens']:,}" in text and f"completion tokens {3 * m['completion_tokens']:,}" in text
    lens = led["tools"]["lens_search"]["calls"]
    assert f"lens_search: {3 * lens:,} calls" in text
    # the pilot searched each query image with Lens: those first searches are in its cache
    r = load_run(pilot)
    searched = {(s.sample_id, e.args["image_id"]) for s in r.index for e in r.full(s).events
                if e.type == "tool_call" and e.name == "lens_search" and e.args["image_id"] in s.query_images}
    n_images = sum(len(s.query_images) for s in r.index)
    assert f"the first Lens search of {len(searched)} of the {n_images} query images is already cached" in text
    assert not out.exists()
    # no pilot: the paper's Table 4 tokens per sample; GPU time and tools unknown
    assert run_main(["--method", "mmcontextfold", "--limit", "5", "--trials", "3", "--out", str(out), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert f"cumulative tokens {PAPER_TABLE4['mmcontextfold']['cumulative_tokens'] * 15:,}" in text
    assert "money: unknown" in text and not out.exists()
    # a pilot of another method is refused
    assert run_main(["--method", "agentfold", "--limit", "2", "--out", str(out), "--dry-run", "--pilot", str(pilot)]) == 2
    assert "a pilot projects its own method" in capsys.readouterr().err


def test_a_providers_reported_cost_is_the_bill_and_the_projection_uses_it(tmp_path, capsys, monkeypatch):
    """OpenRouter's usage.cost: recorded per call, summed per model and per judge, preferred to token prices."""
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or-test")
    pilot = tmp_path / "pilot"
    with FakeSGLang(reply="k</think>\n\n<answer>1911</answer>") as srv:
        srv.cost_per_token = 1e-3
        common = ["--backend", "openai", "--server", "openrouter", "--endpoint", srv.url,
                  "--api-key-env", "OPENROUTER_API_KEY", "--limit", "2"]
        assert run_main(["--method", "react", *common, "--out", str(pilot), "--no-progress"]) == 0
        assert judge_main([str(pilot), "--judge-endpoint", srv.url, "--judge-model", "fake-qwen3.5",
                           "--judge-api-key-env", "OPENROUTER_API_KEY", "--no-progress"]) == 0
    calls = [c for s in load_run(pilot).index for c in s.calls]
    bill = sum(1e-3 * (c.prompt_tokens + c.completion_tokens) for c in calls)
    assert all(c.cost > 0 for c in calls)
    led = compute_ledger(pilot, prices={"models": {}, "tools": {}})  # no price file: the provider's bill still counts
    m = led["models"]["fake-qwen3.5"]
    assert m["provider_cost"] == pytest.approx(bill) and m["money"] == pytest.approx(bill)
    assert m["priced_by"].startswith("provider-reported")
    judge = next(iter(led["judges"].values()))
    assert judge["money"] > 0 and judge["priced_by"].startswith("provider-reported")
    capsys.readouterr()
    assert run_main(["--method", "react", *common, "--trials", "3", "--out", str(tmp_path / "planned"), "--dry-run",
                     "--pilot", str(pilot)]) == 0
    assert f"money: ${3 * bill:,.2f}" in capsys.readouterr().out
