"""Valid records for tests that write a run directory by hand (the writer validates every record: agent/record/),
and a ReAct run recorded through the SGLang fake (record_react_run)."""
from __future__ import annotations

from agent.backends.base import SamplingParams
from agent.run import main as run_main
from agent.rundir import Run, load_run
from serving.fakes.policy import agent_policy
from serving.fakes.sglang_server import FakeSGLang


def header(**over) -> dict:
    """A complete run header of a scripted ReAct run on a benchmark ``x``; ``over`` replaces fields."""
    return {"schema_version": 2, "method": "react", "variant": "", "label": "react", "protocol": "paper",
            "benchmark": "x", "benchmark_path": None, "budgets": {"t_max": 20, "b_max": 5}, "trials": 1,
            "history_reasoning": "keep", "observation_images": 5, "versions": {},
            "model": {"backend": "scripted", "served_model": "scripted-demo", "weights": None, "fingerprint": None},
            "sampling": SamplingParams().to_dict(),
            "backend": {"kind": "scripted", "endpoints": [], "model": None, "model_dir": None,
                        "logprob_mode": "scaled", "server": "sglang", "embedded_tiny_model": False,
                        "api_key_env": None},
            "tools": {"provider": "offline", "world": None, "cache": None, "cache_mode": "readwrite",
                      "live_fallback": False}, **over}


def line(sample_id: str = "s1", trial: int = 0, status: str = "ok", **over) -> dict:
    """A complete result line of a unit that made no call; ``over`` replaces fields."""
    return {"schema_version": 2, "sample_id": sample_id, "trial": trial, "method": "react", "variant": "",
            "benchmark": "x", "category": None, "paper_category": "Uncategorised", "question": "q", "gold": "g",
            "answer": "g" if status == "ok" else "", "status": status, "error": None, "query_images": {},
            "n_calls": 0, "n_tool_calls": 0, "tool_calls": {}, "tool_usage": {}, "generated_tokens": 0,
            "think_tokens": 0, "backend": "scripted", "model": "scripted-demo", "started": 0.0, "finished": 0.0,
            "responses_sha": "0" * 64, "duration_s": 0.0, "calls": [], "events": [], "messages": [],
            "tokens_file": None, **over}


def call(index: int = 1, **over) -> dict:
    """A complete call summary (a result line's ``calls`` entry) of a ReAct call; ``over`` replaces fields."""
    return {"index": index, "state": "react", "branch": None, "correction": False, "forced": False, "n_images": 1,
            "n_query_images": 1, "image_hashes": [None], "prompt_tokens": 100, "completion_tokens": 10,
            "cached_tokens": 0, "think_tokens": 5, "n_tokens": 10, "latency_s": 0.1, "finish_reason": "stop",
            "action": "tool_call", "tool": None, **over}


def record_react_run(out, tiny_model_dir, *, limit: int) -> list[dict]:
    """A ReAct run of the demo benchmark recorded through SGLang's native API against this fake, acting by
    the fakes' policy (serving/fakes/policy.py) with the tiny model's tokenizer (ids that can be scored); returns the request bodies the
    server received."""
    with FakeSGLang(reply=agent_policy, tokenizer_dir=str(tiny_model_dir), model_name=str(tiny_model_dir)) as srv:
        assert run_main(["--method", "react", "--backend", "sglang", "--endpoint", srv.url, "--model-dir",
                         str(tiny_model_dir), "--benchmark", "demo", "--limit", str(limit), "--t-max", "3",
                         "--out", str(out), "--no-progress"]) == 0
        return list(srv.bodies)


def recorded_lines(run) -> list[dict]:
    """A run's latest lines as the file records them (JSON values, only the fields written): what a test asserts
    the record holds; ``run``: a run directory or a loaded :class:`agent.rundir.Run`."""
    return [ln.as_recorded() for ln in (run if isinstance(run, Run) else load_run(run)).lines]
