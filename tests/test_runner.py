"""The runner: record layout, resume, retry, timeout, interruption, endpoints; the pandas reader."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from agent.backends.base import ModelOutput
from agent.backends.messages import text_of
from agent.backends.scripted import ScriptedBackend
from agent.run import RunConfig, run
from agent.run import main as run_main
from agent.rundir import RunDir, RunError, load_run
from serving.fakes.sglang_server import FakeSGLang
from tests.conftest import REPO
from tests.guards import HANG_GUARD_S
from tests.records import recorded_lines


def react_policy(messages):
    """A scripted agent that solves demo_1-style questions: lens, then answer from what it saw."""
    n_assistant = sum(m["role"] == "assistant" for m in messages)
    if n_assistant == 0:
        return ('<think>\nlook\n</think>\n\n<tool_call>\n{"name": "lens_search", "arguments": '
                '{"image_id": "<image_0>", "goal": "identify"}}\n</tool_call>')
    return "<think>\nanswer\n</think>\n\n<answer>seen " + str(n_assistant) + "</answer>"


def cfg(tmp_path, **kw):
    base = dict(method="react", out=str(tmp_path / "run"), benchmark="demo", progress=False, concurrency=3)
    base.update(kw)
    return RunConfig(**base)


async def test_run_writes_header_lines_sidecars_images(tmp_path):
    b = ScriptedBackend([react_policy] * 100)
    summary = await run(cfg(tmp_path, trials=2), [], backends=[b])
    assert summary["counts"] == {"ok": 12} and summary["llm_calls"] == 24
    rd = RunDir(tmp_path / "run")
    header = rd.read_header()
    assert header["method"] == "react" and header["budgets"] == {"t_max": 20, "b_max": 5}
    assert header["sampling"]["temperature"] == 0.2 and header["sampling"]["top_p"] == 0.95
    assert header["sampling"]["top_logprobs"] == 20 and "numpy" in header["versions"]
    run_ = load_run(tmp_path / "run")
    from agent.rundir import frames

    df = frames.results(run_)
    assert len(df) == 12 and set(df.trial) == {0, 1} and (df.status == "ok").all()
    for col in ("sample_id", "trial", "method", "benchmark", "paper_category", "status", "answer", "gold"):
        assert col in df.columns
    calls = frames.steps(run_)
    for col in ("call", "state", "n_images", "prompt_tokens", "completion_tokens", "think_tokens"):
        assert col in calls.columns
    assert len(calls) == 24 and (calls.groupby(["sample_id", "trial"]).size() == 2).all()
    # the sidecar holds each call's tokens, matching the events
    line = run_.lines[0]
    tok = run_.tokens(line)
    assert tok["top_logprobs"].shape[1] == 20 and tok["top_logprobs"].dtype == np.float32
    for c in line.calls:
        assert (tok["call"] == c.index).sum() == c.n_tokens
        assert tok["think"][tok["call"] == c.index].sum() == c.think_tokens
    # images are stored once, by content hash: the query images and the lens result images shown
    hashes = {h for ln in run_.lines for h in ln.query_images.values()}
    shown = {h for ln in run_.lines for e in ln.events if e.type == "tool_call" for h in e.result_images}
    stored = {p.name.split(".")[0] for p in (tmp_path / "run" / "images").iterdir()}
    assert len(hashes) == 7 and shown and stored == hashes | shown
    # messages are recorded with images as hashes, and can be rebuilt per call
    ev = next(e for e in line.events if e.type == "llm_call")
    msgs = [m.as_recorded() for m in run_.call_messages(line, ev)]
    assert msgs[1]["content"][1] == {"type": "image", "sha256": line.query_images["<image_0>"],
                                     "source": msgs[1]["content"][1]["source"]}
    assert "data:" not in (tmp_path / "run" / "results.jsonl").read_text()


async def test_resume_skips_done_and_retry_errors_reruns_failures(tmp_path):
    b = ScriptedBackend([react_policy] * 100)
    await run(cfg(tmp_path, limit=2), [], backends=[b])
    # a rerun does nothing
    again = await run(cfg(tmp_path, limit=4), [], backends=[ScriptedBackend([react_policy] * 100)])
    assert again["skipped"] == 2 and again["ran"] == 2
    # a failing backend: errors are written; --retry-errors reruns only those
    failing = ScriptedBackend([])  # runs out at once -> BackendError -> status=error
    out = await run(cfg(tmp_path, limit=6), [], backends=[failing])
    assert out["counts"] == {"error": 2}
    out = await run(cfg(tmp_path, limit=6), [], backends=[ScriptedBackend([react_policy] * 100)])
    assert out["ran"] == 0
    out = await run(cfg(tmp_path, limit=6, retry_errors=True), [], backends=[ScriptedBackend([react_policy] * 100)])
    assert out["counts"] == {"ok": 2}
    latest = RunDir(tmp_path / "run").latest()
    assert len(latest) == 6 and all(line["status"] == "ok" for line in latest.values())
    assert len(RunDir(tmp_path / "run").index()) == 8  # history kept, latest wins


async def test_header_mismatch_is_refused(tmp_path):
    await run(cfg(tmp_path, limit=1), [], backends=[ScriptedBackend([react_policy] * 10)])
    with pytest.raises(RunError, match="remove_images_from_step"):
        await run(cfg(tmp_path, limit=1, remove_images_from_step=2), [], backends=[ScriptedBackend([react_policy] * 10)])


async def test_torn_last_line_is_ignored_and_rerun(tmp_path, capsys):
    await run(cfg(tmp_path, limit=2), [], backends=[ScriptedBackend([react_policy] * 10)])
    res = tmp_path / "run" / "results.jsonl"
    lines = res.read_bytes().splitlines(keepends=True)
    res.write_bytes(lines[0] + lines[1][:57])  # a crash in the middle of the second line
    rd = RunDir(tmp_path / "run")
    assert len(rd.index()) == 1 and "torn or malformed" in capsys.readouterr().err
    with open(res, "ab") as f:
        f.write(b"\n")
    out = await run(cfg(tmp_path, limit=2), [], backends=[ScriptedBackend([react_policy] * 10)])
    assert out["ran"] == 1 and len(rd.latest()) == 2


class SlowBackend(ScriptedBackend):
    async def generate(self, messages, sampling=None) -> ModelOutput:
        if "Kestrel" not in json.dumps(messages) and "observatory" in text_of(messages[1]).lower():
            await asyncio.sleep(30)
        return await super().generate(messages, sampling)


async def test_timeout_keeps_partial_record(tmp_path):
    b = SlowBackend([react_policy] * 100)
    out = await run(cfg(tmp_path, limit=2, timeout=1.0), [], backends=[b])
    assert out["counts"] == {"timeout": 1, "ok": 1}
    line = next(ln for ln in recorded_lines(tmp_path / "run") if ln["status"] == "timeout")
    assert line["sample_id"] == "demo_1" and "timeout" in line["error"] and line["events"][-1]["type"] == "error"


async def test_several_endpoints_share_the_load(tmp_path):
    a, b = ScriptedBackend([react_policy] * 100, model="m"), ScriptedBackend([react_policy] * 100, model="m")
    c = cfg(tmp_path, trials=2, concurrency=4)
    c.endpoints = ["http://a:1", "http://b:2"]
    await run(c, [], backends=[a, b])
    lines = RunDir(tmp_path / "run").index()
    by_ep = {e: sum(ln["n_calls"] for ln in lines if ln["endpoint"] == e) for e in c.endpoints}
    assert by_ep["http://a:1"] >= 4 and by_ep["http://b:2"] >= 4
    # a trajectory stays on one endpoint: each backend made exactly the calls of the lines given to it
    assert len([x for x in a.calls if x["kind"] == "generate"]) == by_ep["http://a:1"]
    assert len([x for x in b.calls if x["kind"] == "generate"]) == by_ep["http://b:2"]


async def test_endpoints_serving_different_models_are_refused(tmp_path):
    from agent.preflight import PreflightError

    a, b = ScriptedBackend([react_policy] * 10, model="a"), ScriptedBackend([react_policy] * 10, model="b")
    with pytest.raises(PreflightError, match="different models"):
        await run(cfg(tmp_path), [], backends=[a, b])
    assert not (tmp_path / "run" / "results.jsonl").exists()


def _runner_cmd(url, out, trials=3, processes=1):
    return [sys.executable, "-m", "agent.run", "--method", "react", "--backend", "openai", "--endpoint", url,
            "--benchmark", "demo", "--trials", str(trials), "--concurrency", "2", "--t-max", "4", "--out", str(out),
            "--no-progress", "--processes", str(processes)]


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux /proc)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = open(f"/proc/{d}/stat").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d))
    return out


def _running(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pids: list[int], guard_s: float) -> None:
    """Until none of ``pids`` runs (a guard against a hang, not a measure of speed)."""
    deadline = time.time() + guard_s
    while any(_running(p) for p in pids):
        if time.time() > deadline:
            pytest.fail(f"orphaned workers {pids}: no progress for {guard_s:g} s (still running)")
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.parametrize("sig,processes", [(signal.SIGKILL, 1), (signal.SIGINT, 1), (signal.SIGKILL, 2), (signal.SIGINT, 2)])
def test_killed_runner_resumes_without_loss_or_duplicates(tmp_path, sig, processes):
    out = tmp_path / "run"
    with FakeSGLang(latency_s=0.1) as srv:
        # Ctrl-C's default action even where the suite itself was started in the background (a shell then
        # ignores SIGINT in it and its children, and Python leaves an inherited SIG_IGN alone)
        p = subprocess.Popen(_runner_cmd(srv.url, out, processes=processes), cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        res = out / "results.jsonl"
        deadline = time.time() + 300
        while time.time() < deadline:
            if res.exists() and res.read_bytes().count(b"\n") >= 3:
                break
            time.sleep(0.05)
        srv.gate.clear()  # no reply from now on: the run cannot finish before the signal, however fast it is
        time.sleep(0.5)   # (not an assertion's timing: lets the replies already sent land or not, either is fine)
        workers = _children(p.pid)
        p.send_signal(sig)
        p.wait(timeout=HANG_GUARD_S)  # the runner itself; after a SIGKILL its orphaned workers stop by themselves
        _wait_gone(workers, 300)  # ...while no reply comes, so none of them writes a line after the kill
        srv.gate.set()    # the held requests answer the dead runner; the rerun's are answered as they come
        _, err = p.communicate(timeout=HANG_GUARD_S)  # (the workers hold the pipes until they stop by themselves)
        before = res.read_bytes()
        n_before = before.count(b"\n")
        assert 3 <= n_before < 18, "the run must be killed mid-way"
        if sig == signal.SIGINT:
            assert p.returncode == 130 and b"rerun the same command to resume" in err
        # orphaned worker processes of a killed parent stop by themselves; the rerun waits for them
        r = subprocess.run(_runner_cmd(srv.url, out, processes=processes), cwd=REPO, capture_output=True, timeout=HANG_GUARD_S)
        assert r.returncode == 0, r.stderr.decode()[-2000:]
    after = res.read_bytes()
    assert after.startswith(before)  # append-only: nothing already written changed
    keys = [(ln["sample_id"], ln["trial"]) for ln in map(json.loads, after.splitlines())]
    assert len(keys) == len(set(keys)) == 18
    if processes == 1:  # with worker processes, a line can land between the kill and their exit
        assert f"{18 - n_before} to run".encode() in r.stderr


def test_two_runners_on_one_directory_are_refused(tmp_path):
    from agent.rundir import RunDir

    holder = RunDir(tmp_path / "run")
    holder.lock()
    with pytest.raises(RunError, match="another runner"):
        RunDir(tmp_path / "run").lock(wait_s=0.3)
    holder.unlock()
    RunDir(tmp_path / "run").lock(wait_s=0.3)


def test_cli_errors_are_clear(tmp_path, capsys):
    assert run_main(["--method", "react", "--variant", "no-init", "--out", str(tmp_path / "x")]) == 2
    assert "mmcontextfold only" in capsys.readouterr().err
    assert run_main(["--method", "react", "--benchmark", str(tmp_path / "missing"), "--out", str(tmp_path / "x")]) == 2
    assert "missing" in capsys.readouterr().err
    assert run_main(["--method", "react", "--backend", "openai", "--out", str(tmp_path / "y")]) == 2
    assert "--endpoint" in capsys.readouterr().err
    assert not (tmp_path / "y" / "results.jsonl").exists()


@pytest.mark.model
def test_embedded_default_runs_end_to_end(tmp_path, tiny_model_dir, monkeypatch, capsys):
    monkeypatch.setenv("MMCF_TINY_MODEL_DIR", str(tiny_model_dir))
    rc = run_main(["--method", "mmcontextfold", "--limit", "1", "--t-max", "4", "--max-tokens", "8",
                   "--out", str(tmp_path / "emb"), "--no-progress"])
    assert rc == 0
    err = capsys.readouterr().err
    assert "RANDOMLY INITIALISED" in err
    # no unit can end with an answer on random weights: the command that does is offered, and it does
    offered = next(ln for ln in err.splitlines() if "never write an answer" in ln).split(": python -m agent.run ")[1]
    assert "--backend scripted" in offered and "falling back to its reference PyTorch" not in err
    assert run_main([*offered.split(), "--no-progress"]) == 0
    assert {ln["status"] for ln in recorded_lines(tmp_path / "emb-scripted")} == {"ok"}
    run_ = load_run(tmp_path / "emb")
    line = run_.lines[0]
    assert line.n_calls == 4 and line.calls[0].state == "init" and line.backend == "local"
    tok = run_.tokens(line)
    assert len(tok["id"]) == line.generated_tokens > 0 and np.isfinite(tok["exact_entropy"]).all()


async def test_float16_storage_is_smaller_and_close(tmp_path):
    outs = {}
    for prec in ("float32", "float16"):
        await run(cfg(tmp_path / prec, limit=2, token_precision=prec), [],
                  backends=[ScriptedBackend([react_policy] * 10, top_fn=lambda h, p: [-0.1234567, -2.7654321] + [-9.87654] * 18)])
        run_ = load_run(tmp_path / prec / "run")
        assert run_.header.token_precision == prec
        outs[prec] = run_.tokens(run_.lines[0])["top_logprobs"]
    assert outs["float32"][0, 0] == np.float32(-0.1234567)
    assert outs["float16"][0, 0] != outs["float32"][0, 0]
    assert np.allclose(outs["float16"], outs["float32"], atol=5e-3)


async def test_step_entropies_recover_planted_entropy(tmp_path):
    import math

    from agent.backends.scripted import uniform_top
    from agent.rundir.frames import step_entropies

    await run(cfg(tmp_path, limit=3), [], backends=[ScriptedBackend([react_policy] * 10, top_fn=uniform_top(8))])
    df = step_entropies(load_run(tmp_path / "run"))
    assert len(df) == 6 and list(df.step.unique()) == [1, 2]
    assert (df.n_think > 0).all() and np.allclose(df.H, math.log(8))
    assert (df.n_query_images == 1).all() and df.H_exact.isna().all()  # the scripted backend has no exact entropy


# ------------------------------------------------------------------ refused before any work; exit codes
def _cli(srv_url, out, *extra):
    return ["--method", "react", "--backend", "openai", "--endpoint", srv_url, "--benchmark", "demo", "--t-max", "3",
            "--out", str(out), "--no-progress", *extra]


def test_unreachable_endpoint_and_wrong_model_are_refused_before_any_work(tmp_path, capsys):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    s.close()
    assert run_main(_cli(dead, tmp_path / "a")) == 2
    assert "unreachable" in capsys.readouterr().err
    assert not (tmp_path / "a" / "header.json").exists()
    with FakeSGLang(model_name="qwen3.5-27b") as srv:
        assert run_main(_cli(srv.url, tmp_path / "b", "--model", "qwen3.5-9b")) == 2
        err = capsys.readouterr().err
        assert "does not serve 'qwen3.5-9b'" in err and "qwen3.5-27b" in err
        assert not (tmp_path / "b" / "header.json").exists() and not srv.bodies  # nothing was generated
        # the served model and its identity are recorded; a resume against another model is refused
        assert run_main(_cli(srv.url, tmp_path / "c", "--limit", "1")) == 0
        h = json.loads((tmp_path / "c" / "header.json").read_text())
        assert h["model"]["served_model"] == "qwen3.5-27b" and h["history_reasoning"] == "keep"
    with FakeSGLang(model_name="qwen3.5-9b") as srv:
        assert run_main(_cli(srv.url, tmp_path / "c", "--limit", "2")) == 2
        assert "holds a different run" in capsys.readouterr().err


def test_missing_images_are_refused_unless_allowed(tmp_path, capsys):
    import shutil

    from agent.tools.demo_world import ensure_demo_world

    bench = tmp_path / "bench"
    shutil.copytree(ensure_demo_world() / "demo", bench)
    (bench / "imgs" / "kestrel_logo.png").unlink()
    (bench / "imgs" / "valdoria_flag.png").write_text("not an image")
    args = ["--method", "direct", "--benchmark", str(bench), "--out", str(tmp_path / "r"), "--no-progress"]
    assert run_main(args) == 2
    err = capsys.readouterr().err
    assert "2 of 6 samples" in err and "--allow-missing-images" in err and "agent.benchmarks stats" in err
    assert not (tmp_path / "r" / "header.json").exists()


async def test_allow_missing_images_runs_the_rest_and_lists_the_skipped(tmp_path):
    import shutil

    from agent.tools.demo_world import ensure_demo_world

    bench = tmp_path / "bench"
    shutil.copytree(ensure_demo_world() / "demo", bench)
    (bench / "imgs" / "kestrel_logo.png").unlink()
    s = await run(cfg(tmp_path, benchmark=str(bench), allow_missing_images=True), [],
                  backends=[ScriptedBackend([react_policy] * 100)])
    assert s["skipped_images"] == 1 and s["ran"] == 5
    skipped = json.loads((tmp_path / "run" / "skipped_samples.json").read_text())
    assert [x["sample_id"] for x in skipped] == ["demo_1"]


def test_live_tools_need_their_keys_and_a_lens_url(tmp_path, monkeypatch, capsys):
    for v in ("SERPER_API_KEY", "JINA_API_KEY", "MMCF_LENS_URL_TEMPLATE", "MMCF_LENS_S3_BUCKET"):
        monkeypatch.delenv(v, raising=False)
    args = ["--method", "react", "--tools", "live", "--out", str(tmp_path / "r"), "--no-progress"]
    assert run_main(args) == 2 and "SERPER_API_KEY" in capsys.readouterr().err
    monkeypatch.setenv("SERPER_API_KEY", "sk-x")
    assert run_main(args) == 2 and "MMCF_LENS_URL_TEMPLATE" in capsys.readouterr().err
    assert not (tmp_path / "r" / "header.json").exists()


def test_errors_give_exit_3_with_the_retry_command_and_a_streak_stops_the_run(tmp_path, capsys):
    with FakeSGLang() as srv:
        srv.faults = ["400"]  # the first generation is refused by the server: one unit ends in error
        rc = run_main(_cli(srv.url, tmp_path / "a", "--concurrency", "1"))
        err = capsys.readouterr().err
        assert rc == 3 and "1 unit(s) ended in error" in err
        assert "--retry-errors" in err and f"--out {tmp_path / 'a'}" in err
        assert run_main(_cli(srv.url, tmp_path / "a", "--concurrency", "1", "--retry-errors")) == 0
        srv.faults = ["400"] * 50  # every request refused: stop after 3 in a row, not after all 6
        rc = run_main(_cli(srv.url, tmp_path / "b", "--concurrency", "1", "--max-consecutive-errors", "3"))
        err = capsys.readouterr().err
        assert rc == 4 and "3 harness errors in a row" in err
        assert len(RunDir(tmp_path / "b").index()) == 3


@pytest.mark.parametrize("deterministic", [False, True])
def test_header_records_whether_the_server_is_deterministic(tmp_path, capsys, deterministic):
    from serving.fakes.sglang_server import FakeServer

    srv = FakeServer(deterministic=deterministic)
    import threading

    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        assert run_main(_cli(srv.url, tmp_path / "r", "--limit", "1", "--seed", "5")) == 0
    finally:
        srv.shutdown()
        srv.server_close()
    h = json.loads((tmp_path / "r" / "header.json").read_text())
    assert h["model"]["deterministic"] is deterministic
    warned = "--seed has no effect" in capsys.readouterr().err
    assert warned is (not deterministic)


@pytest.mark.slow
def test_worker_processes_load_the_parents_tokenizer_class_without_torch(tiny_model_dir, tmp_path):
    """A --processes worker gets the class AutoTokenizer chose in the parent and its fingerprint: it loads the
    same tokenizer without importing torch, and falls back to the ordinary load when the fingerprint differs."""
    from agent.backends import local as L

    parent = L.load_chat_renderer(tiny_model_dir)
    hints = L.renderer_hints()
    key = str(tiny_model_dir)
    assert hints[key]["class"].endswith(":" + type(parent).__qualname__)
    code = ("import json, sys\nfrom agent.backends import local as L\nL.set_renderer_hints(json.loads(sys.argv[1]))\n"
            "tok = L.load_chat_renderer(sys.argv[2])\n"
            "print(json.dumps({'torch': 'torch' in sys.modules, 'fp': L._fingerprint(tok), 'cls': type(tok).__name__}))")
    bad = {key: dict(hints[key], fingerprint="0" * 64)}
    got = {}
    for name, h in (("hinted", hints), ("mismatch", bad)):
        r = subprocess.run([sys.executable, "-c", code, json.dumps(h), key], capture_output=True, text=True, cwd=REPO,
                           timeout=HANG_GUARD_S)
        assert r.returncode == 0, r.stderr[-2000:]
        got[name] = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["hinted"] == {"torch": False, "fp": hints[key]["fingerprint"], "cls": type(parent).__name__}
    # a differing fingerprint: the ordinary load (the class the config names, still without torch), same tokenizer
    assert got["mismatch"] == {"torch": False, "fp": hints[key]["fingerprint"], "cls": type(parent).__name__}


def test_processes_auto_takes_one_per_128_in_flight_capped_by_the_cpus(monkeypatch, tmp_path):
    from agent import run as run_mod
    from agent.run import PROCESS_CONCURRENCY, RunConfig, auto_processes

    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    cfg = lambda **kw: RunConfig(method="react", out=str(tmp_path / "r"), backend="sglang", **kw)  # noqa: E731
    assert RunConfig(method="react", out="x").processes == "auto"
    assert PROCESS_CONCURRENCY == 128
    assert [auto_processes(cfg(concurrency=c)) for c in (8, PROCESS_CONCURRENCY, PROCESS_CONCURRENCY + 1, 10_000)] \
        == [1, 1, 2, 4]
    assert auto_processes(cfg(concurrency=1024, processes=3)) == 3             # an explicit count is kept
    assert auto_processes(cfg(concurrency=1024), injected=True) == 1           # the caller's own backends
    assert auto_processes(RunConfig(method="react", out="x", backend="local", concurrency=1024)) == 1
    with pytest.raises(ValueError, match="--processes must be auto or an integer"):
        cfg(processes=0).spec()
    ap_err = subprocess.run([sys.executable, "-m", "agent.run", "--method", "react", "--out", str(tmp_path / "r"),
                             "--processes", "none"], cwd=REPO, capture_output=True, text=True)
    assert ap_err.returncode == 2 and "auto or an integer >= 1" in ap_err.stderr
    # the header records the number that ran
    assert run_mod.main(["--method", "react", "--benchmark", "demo", "--backend", "scripted", "--limit", "1",
                         "--out", str(tmp_path / "s"), "--no-progress"]) == 0
    assert json.loads((tmp_path / "s" / "header.json").read_text())["processes"] == 1


def test_a_server_that_changes_model_mid_run_is_caught_and_nothing_of_the_other_model_is_kept(tmp_path, capsys,
                                                                                               tiny_model_dir):
    """F6: SGLang's native replies do not name the model; after each trajectory the runner asks the server which
    weights it serves. Once they change, every trajectory ends `error` (ServedModelChanged) without its calls,
    and the command says why."""
    from serving.fakes.sglang_server import FakeSGLang

    calls = {"n": 0}
    with FakeSGLang(tokenizer_dir=str(tiny_model_dir), model_name=str(tiny_model_dir)) as srv:
        def reply(req):
            calls["n"] += 1
            if calls["n"] == 3:  # the server is redeployed with other weights while the third unit runs
                srv.model_name = "/models/Other-Model"
            return "<think>\nok\n</think>\n\n<answer>1911</answer>"

        srv.reply = reply
        rc = run_main(["--method", "react", "--backend", "sglang", "--endpoint", srv.url, "--model-dir",
                       str(tiny_model_dir), "--limit", "6", "--concurrency", "1", "--t-max", "3", "--out",
                       str(tmp_path / "run"), "--no-progress"])
    err = capsys.readouterr().err
    lines = recorded_lines(tmp_path / "run")
    changed = [ln for ln in lines if str(ln.get("error") or "").startswith("ServedModelChanged")]
    assert rc != 0 and changed and "because the served model changed under the run" in err
    assert all(ln["n_calls"] == 0 and not ln.get("tokens_file") for ln in changed)  # nothing of theirs kept
    assert all(ln["status"] == "ok" for ln in lines if ln not in changed)
    assert "/models/Other-Model" in changed[0]["error"]


def test_force_into_another_methods_run_moves_it_aside_and_starts_afresh(tmp_path, capsys):
    """``--force`` never mixes configurations (issue 55, item 4): the other method's run is renamed aside (the
    name printed), and the new run's header and every line belong to the new method alone."""
    out = tmp_path / "x"
    base = ["--backend", "scripted", "--limit", "2", "--out", str(out), "--no-progress"]
    assert run_main(["--method", "react", *base]) == 0
    capsys.readouterr()
    assert run_main(["--method", "mmcontextfold", *base]) == 2  # refused: says what --force would do
    assert "--force to move that run aside" in capsys.readouterr().err
    assert run_main(["--method", "mmcontextfold", *base, "--force"]) == 0
    err = capsys.readouterr().err
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("x.replaced-")]
    assert len(aside) == 1 and str(aside[0]) in err and "0 already done, 2 to run" in err
    run = load_run(out)
    assert run.header.method == "mmcontextfold" and not run.header.resumed
    assert [ln.method for ln in run.lines] == ["mmcontextfold"] * 2
    old = load_run(aside[0])
    assert old.header.method == "react" and [ln.method for ln in old.lines] == ["react"] * 2
    assert run_main(["--method", "mmcontextfold", *base, "--force"]) == 0  # the same run again: a plain resume
    assert "2 already done, 0 to run" in capsys.readouterr().err
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("x.replaced-")]) == 1
