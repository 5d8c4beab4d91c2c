"""SGLang servers for the paper's Qwen3.5 backbones (paper B.1): tensor parallel on an 8-GPU node, top-20 logprobs.

    bash serving/launch_qwen35.sh [options] [MODEL ...]      # = python -m serving.launch; MODEL: 9b | 27b | 35b-a3b

One server per MODEL on its own GPU group (default: consecutive blocks of --tp GPUs, so "0,1,2,3" and
"4,5,6,7" for the default 9b 27b), ports 30000, 30001, ... Weights: $QWEN35_9B_PATH / $QWEN35_27B_PATH /
$QWEN35_35B_A3B_PATH, else $MODEL_DIR/Qwen3.5-9B (…), else the hub id Qwen/Qwen3.5-9B (…). Each server runs
``python -m sglang.launch_server --model-path W --served-model-name qwen3.5-SIZE --tp-size TP
--reasoning-parser qwen3 --mem-fraction-static F --context-length N`` with CUDA_VISIBLE_DEVICES set to its
group (SGLANG_EXTRA_ARGS appended); no speculative decoding (it breaks logprobs).

Before anything starts (and in --dry-run): the GPU groups must fit the models and --tp, the GPUs must
exist, ports must be free, weights must have a config.json, sglang must import. After launch, and in
--dry-run, it prints per server the filled-in client flags, the log file, the stop command, and an
*estimate* of weights + KV-cache memory per GPU read from the model's config.json. While a server loads,
the elapsed time and its last log line are shown. ``--router`` starts one sglang-router per model (a
router never mixes models: without --enable-igw it ignores the model name). Everything is recorded in
--run-dir: logs, PIDs, the exact commands and ``endpoints.json`` (per URL: the served model, weights,
GPUs, logprob mode, deterministic or not, status). Stop with ``bash serving/stop.sh --run-dir DIR``.

Test hooks: MMCF_SGLANG_SERVER_CMD / MMCF_SGLANG_ROUTER_CMD replace the server / router command (a
stand-in), MMCF_GPU_COUNT and MMCF_GPU_MEM_GB stand in for nvidia-smi, MMCF_STATE_DIR for where launched
run directories are remembered (default ~/.local/state/mmcf-toolkit).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MODELS", "Server", "plan", "server_command", "router_command", "memory_estimate", "main", "state_file"]

#: size -> (hub id, served model name, nominal parameter count): the paper's three local backbones (B.1).
MODELS = {
    "9b": ("Qwen/Qwen3.5-9B", "qwen3.5-9b", 9e9),
    "27b": ("Qwen/Qwen3.5-27B", "qwen3.5-27b", 27e9),
    "35b-a3b": ("Qwen/Qwen3.5-35B-A3B", "qwen3.5-35b-a3b", 35e9),
}


class LaunchError(RuntimeError):
    """A launch that cannot work as asked: said before anything starts."""


@dataclass
class Server:
    size: str
    port: int
    gpus: str
    weights: str
    served: str
    cmd: list[str]
    env: dict[str, str]
    name: str = ""
    log: str = ""
    nccl_port: int = 0


def state_file() -> Path:
    base = os.environ.get("MMCF_STATE_DIR") or os.path.join(
        os.environ.get("XDG_STATE_HOME", os.path.expanduser("~/.local/state")), "mmcf-toolkit")
    return Path(base) / "serve-dirs.txt"


#: The conformance layer (scripts/sglang_conformance.sh): SGLang's own code importable on a CPU machine.
REPO = Path(__file__).resolve().parents[1]
SGLANG_SITE = Path(os.environ.get("MMCF_SGLANG_SITE", REPO / ".venv-sglang" / "site"))


def weights_for(size: str, standin: str | None = None) -> str:
    hub = MODELS[size][0]
    var = f"QWEN35_{size.upper().replace('-', '_')}_PATH"
    if os.environ.get(var):
        return os.environ[var]
    if os.environ.get("MODEL_DIR"):
        return os.path.join(os.environ["MODEL_DIR"], hub.split("/")[1])
    if standin:  # SGLang's front end on CPU: the embedded tiny Qwen3.5 stands in for every backbone
        try:
            # the launcher itself runs on a bare python3; the stand-in needs the toolkit's `local` extra
            from agent.backends.tiny_model import ensure_tiny_model  # noqa: PLC0415 - optional heavy (transformers)

            return str(ensure_tiny_model(os.environ.get("MMCF_TINY_MODEL_DIR"), quiet=True))
        except ImportError as e:
            raise LaunchError(f"--standin needs the embedded tiny model ({e}); run the launcher with the project's "
                              "venv: PYTHON=.venv/bin/python bash serving/launch_qwen35.sh --standin ...") from None
    return hub


def _is_local(size: str) -> bool:
    return bool(os.environ.get(f"QWEN35_{size.upper().replace('-', '_')}_PATH") or os.environ.get("MODEL_DIR"))


def server_command(size: str, port: int, a, nccl_port: int | None = None) -> list[str]:
    """The server's command line; every port it binds is given (``--nccl-port`` too: left to SGLang, servers
    started together can race for the same free port)."""
    nccl = ["--nccl-port", str(nccl_port)] if nccl_port else []
    if getattr(a, "standin", None):  # SGLang's own front end, our scheduler stand-in (serving/standin.py)
        return [a.python, "-m", "serving.standin", "--model-path", weights_for(size, a.standin), "--served-model-name",
                MODELS[size][1], "--host", a.host, "--port", str(port), "--mode", a.standin, *nccl]
    base = shlex.split(os.environ["MMCF_SGLANG_SERVER_CMD"]) if os.environ.get("MMCF_SGLANG_SERVER_CMD") else \
        [a.python, "-m", "sglang.launch_server"]
    cmd = [*base, "--model-path", weights_for(size), "--served-model-name", MODELS[size][1], "--tp-size", str(a.tp),
           "--host", a.host, "--port", str(port), *nccl, "--reasoning-parser", "qwen3",
           "--mem-fraction-static", str(a.mem_fraction), "--context-length", str(a.context_length)]
    if a.deterministic:
        cmd.append("--enable-deterministic-inference")
    return cmd + shlex.split(os.environ.get("SGLANG_EXTRA_ARGS", ""))


def router_command(worker_urls: list[str], port: int, a, prometheus_port: int | None = None) -> list[str]:
    """One router's command line. Its Prometheus port is always given: every router defaults to 29000
    (sglang_router/router_args.py), so a second router could not bind it and the launch failed."""
    base = shlex.split(os.environ["MMCF_SGLANG_ROUTER_CMD"]) if os.environ.get("MMCF_SGLANG_ROUTER_CMD") else \
        [a.python, "-m", "sglang_router.launch_router"]
    prom = ["--prometheus-port", str(prometheus_port)] if prometheus_port else []
    return [*base, "--worker-urls", *worker_urls, "--policy", "cache_aware", "--host", a.host, "--port", str(port), *prom]


def _groups(a) -> list[str]:
    if a.gpu_groups:
        return a.gpu_groups.split()
    return [",".join(str(j) for j in range(i * a.tp, (i + 1) * a.tp)) for i in range(len(a.models))]


def _gpu_count() -> int | None:
    if os.environ.get("MMCF_GPU_COUNT"):
        return int(os.environ["MMCF_GPU_COUNT"])
    if shutil.which("nvidia-smi"):
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
        return sum(line.startswith("GPU ") for line in out.splitlines())
    return None


def _gpu_mem_gb() -> float | None:
    if os.environ.get("MMCF_GPU_MEM_GB"):
        return float(os.environ["MMCF_GPU_MEM_GB"])
    if shutil.which("nvidia-smi"):
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True).stdout.split()
        if out:
            return float(out[0]) / 1024
    return None


def plan(a) -> list[Server]:
    """The servers to start, checked for everything that does not need the GPUs themselves."""
    groups = _groups(a)
    if len(groups) < len(a.models):
        need = len(a.models) * a.tp
        raise LaunchError(f"{len(a.models)} model(s) ({' '.join(a.models)}) need {len(a.models)} GPU groups of {a.tp} "
                          f"GPUs ({need} GPUs in all) but --gpu-groups gives {len(groups)}: {a.gpu_groups!r}")
    n = None if a.standin else _gpu_count()
    nccl = a.nccl_port if a.nccl_port is not None else a.port + 1000
    out = []
    for i, size in enumerate(a.models):
        ids = groups[i].split(",")
        if len(ids) != a.tp:
            raise LaunchError(f"GPU group '{groups[i]}' has {len(ids)} GPUs but --tp is {a.tp}")
        for g in ids:
            if not g.isdigit():
                raise LaunchError(f"GPU group '{groups[i]}': {g!r} is not a GPU index")
            if n is not None and int(g) >= n:
                raise LaunchError(f"GPU {g} requested (group '{groups[i]}' for {size}; {len(a.models)} model(s) x TP "
                                  f"{a.tp} need {len(a.models) * a.tp} GPUs) but this machine has {n} GPU(s)")
        port = a.port + i
        env = {"CUDA_VISIBLE_DEVICES": groups[i]}
        if a.standin:  # SGLang's code from the conformance layer, the toolkit's stand-in from this checkout
            env = {"PYTHONPATH": os.pathsep.join([str(REPO), str(SGLANG_SITE)])}
        if a.logprobs == "raw":
            env["SGLANG_RETURN_ORIGINAL_LOGPROB"] = "1"
        name = f"{MODELS[size][1]}-{port}"
        out.append(Server(size, port, "cpu (stand-in)" if a.standin else groups[i], weights_for(size, a.standin), MODELS[size][1],
                          server_command(size, port, a, nccl + i), env, name=name,
                          log=str(Path(a.run_dir) / f"{name}.log"), nccl_port=nccl + i))
    return out


# ------------------------------------------------------------------ memory estimate
def _config_of(weights: str) -> tuple[dict | None, str | None]:
    """(config.json, where it was found): the weights directory, else the local Hugging Face cache."""
    p = Path(weights)
    if (p / "config.json").is_file():
        return json.loads((p / "config.json").read_text()), str(p / "config.json")
    try:
        from huggingface_hub import try_to_load_from_cache  # noqa: PLC0415 - the launcher runs on a bare python3

        hit = try_to_load_from_cache(weights, "config.json")
        if isinstance(hit, str):
            return json.loads(Path(hit).read_text()), hit
    except Exception:  # noqa: BLE001 - no hub library or not a repo id: no estimate
        pass
    return None, None


def memory_estimate(weights: str, size: str, tp: int, mem_fraction: float, gpu_gb: float | None) -> str:
    """One line: an *estimate* of weights and KV-cache memory per GPU (bf16), from the model's config.json."""
    cfg, where = _config_of(weights)
    files = list(Path(weights).glob("*.safetensors")) if Path(weights).is_dir() else []
    if files:
        w_bytes, w_src = sum(f.stat().st_size for f in files), "safetensors files"
    else:
        w_bytes, w_src = MODELS[size][2] * 2, "2 bytes x nominal parameters"
    parts = [f"weights {w_bytes / 1e9:.1f} GB ({w_src}) -> {w_bytes / tp / 1e9:.1f} GB per GPU at TP {tp}"]
    if cfg is None:
        parts.append("KV cache: config.json not found locally (download the weights for an estimate)")
    else:
        t = cfg.get("text_config") or cfg
        layers = t.get("layer_types")
        n_full = sum(x == "full_attention" for x in layers) if layers else int(t.get("num_hidden_layers", 0))
        kv = int(t.get("num_key_value_heads") or t.get("num_attention_heads") or 0)
        hd = int(t.get("head_dim") or (t.get("hidden_size", 0) // max(1, t.get("num_attention_heads", 1))))
        per_gpu_heads = max(1, -(-kv // tp))  # KV heads split over TP (replicated when fewer than TP)
        kv_tok = 2 * n_full * per_gpu_heads * hd * 2
        parts.append(f"KV {kv_tok / 1024:.0f} KiB/token per GPU ({n_full} full-attention layers x {kv} KV heads x "
                     f"head dim {hd}, bf16{'; linear-attention layers keep a fixed per-request state' if layers else ''})")
        if gpu_gb:
            left = gpu_gb * mem_fraction - w_bytes / tp / 1e9
            parts.append(f"of {gpu_gb:.0f} GB x {mem_fraction} = {gpu_gb * mem_fraction:.1f} GB per GPU, ~{left:.1f} GB "
                         f"remain for the KV cache (~{max(left, 0) * 1e9 / kv_tok / 1e6:.2f} M tokens)")
    return "memory (estimate): " + "; ".join(parts) + (f" [config: {where}]" if where else "")


# ------------------------------------------------------------------ launching
def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a zombie (exited, not yet reaped) is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return True


def _last_line(log: str) -> str:
    try:
        with open(log, "rb") as f:
            f.seek(max(0, os.path.getsize(log) - 4000))
            lines = [x for x in f.read().decode(errors="replace").splitlines() if x.strip()]
        return lines[-1][-160:] if lines else "(no output yet)"
    except OSError:
        return "(no log yet)"


def _wait_ready(url: str, proc: subprocess.Popen, log: str, name: str, timeout: float,
                every: float = float(os.environ.get("MMCF_PROGRESS_EVERY_S", 15))) -> str:
    """Wait for /health_generate then /v1/models; show progress; returns the served model id."""
    t0 = time.time()
    next_note, last = t0 + every, ""
    while time.time() - t0 < timeout:
        if proc.poll() is not None or not _alive(proc.pid):
            tail = open(log, errors="replace").read()[-2000:] if os.path.exists(log) else ""
            raise LaunchError(f"{name}: the server exited before it was ready; last log lines ({log}):\n{tail}")
        try:
            urllib.request.urlopen(url + "/health_generate", timeout=10).read()
            models = json.load(urllib.request.urlopen(url + "/v1/models", timeout=10))
            return models["data"][0]["id"]
        except Exception as e:  # noqa: BLE001 - not up yet
            last = str(e)
        if time.time() >= next_note:
            print(f"  waiting for {name}: {time.time() - t0:.0f} s; last log line: {_last_line(log)}", flush=True)
            next_note = time.time() + every
        time.sleep(2 if timeout > 30 else 0.2)
    raise LaunchError(f"{name}: not ready after {timeout:g}s ({url}/health_generate: {last}); see {log}")


def _start(cmd: list[str], env: dict, log: str) -> subprocess.Popen:
    with open(log, "wb") as f:
        return subprocess.Popen(cmd, env={**os.environ, **env}, stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def proc_start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat, field 22): with the PID, it names one
    process for good (a recycled PID has another), whatever title the process gives itself (SGLang and its
    router set theirs, so the command line is no identity)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def pid_record(pid: int) -> str:
    """A PID file's text: ``PID START_TIME`` (see :func:`proc_start_time`)."""
    start = proc_start_time(pid)
    return f"{pid} {start}" if start else str(pid)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
    except OSError:
        pass


def _remember(run_dir: Path) -> None:
    f = state_file()
    try:
        f.parent.mkdir(parents=True, exist_ok=True)
        known = set(f.read_text().split("\n")) if f.exists() else set()
        if str(run_dir) not in known:
            with open(f, "a") as fh:
                fh.write(str(run_dir) + "\n")
    except OSError:
        pass  # remembering is a convenience for stop.sh, never a reason to fail


def _client_url(a, port: int) -> str:
    """The URL clients (and a gateway on another node) use: --advertise-host when given (a multi-node topology:
    serving/gateway.py reads it from endpoints.json), else the listen address (0.0.0.0: this node's loopback)."""
    if getattr(a, "advertise_host", None):
        return f"http://{a.advertise_host}:{port}"
    host = "127.0.0.1" if a.host in ("0.0.0.0", "::") else a.host
    return f"http://{host}:{port}"


def _describe(a, s: Server, gpu_gb, run_dir: Path) -> list[str]:
    url = _client_url(a, s.port)
    stop = f"bash serving/stop.sh --run-dir {shlex.quote(str(run_dir))}"
    return [f"{s.served} on GPUs {s.gpus} -> {url}",
            f"  clients: --backend sglang --endpoint {url} --model-dir {shlex.quote(s.weights)} --logprob-mode {a.logprobs}",
            f"  (or --backend openai --endpoint {url} --model {s.served}); smoke test: python -m serving.check --endpoint {url}",
            f"  log: {s.log}", f"  stop: {stop}",
            f"  {memory_estimate(s.weights, s.size, a.tp, a.mem_fraction, gpu_gb)}"]


def _write_endpoints(run_dir: Path, entries: list[dict]) -> None:
    tmp = run_dir / "endpoints.json.tmp"
    tmp.write_text(json.dumps(entries, indent=2))
    os.replace(tmp, run_dir / "endpoints.json")



def preflight(a, servers: list[Server], routers, ports) -> list[tuple]:
    """Every check before a launch, as ``(state, what, detail[, refusal])``: state ``ok``, ``FAIL`` (the launch
    would stop, detail is its message) or ``unchecked`` (it needs the GPU node: no ``nvidia-smi`` here). A launch
    stops at the first FAIL, and at an unchecked item that has a refusal; ``--dry-run`` reports them all."""
    out: list[tuple] = []
    n_gpus = None if a.standin else _gpu_count()
    on_node = a.standin or n_gpus is not None

    def add(ok: bool, what: str, fail: str, detail_ok: str = "", away: str | None = None):
        """``away``: what to say when the check fails off the GPU node (unchecked there, refused by a launch)."""
        if ok:
            out.append(("ok", what, detail_ok))
        elif away is not None and not on_node:
            out.append(("unchecked", what, away, fail))
        else:
            out.append(("FAIL", what, fail))

    if a.standin:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(SGLANG_SITE)])}
        add(not subprocess.run([a.python, "-c", "import sglang.srt.entrypoints.http_server"], capture_output=True,
                               env=env).returncode, "SGLang's front end imports",
            f"SGLang's front end does not import from {SGLANG_SITE}: run bash scripts/sglang_conformance.sh",
            str(SGLANG_SITE))
    elif os.environ.get("MMCF_SGLANG_SERVER_CMD"):
        out.append(("ok", "server command", "MMCF_SGLANG_SERVER_CMD (a stand-in)"))
    else:
        add(not subprocess.run([a.python, "-c", "import sglang"], capture_output=True).returncode, "sglang imports",
            f"sglang is not installed for {a.python}: pip install -e '.[serve]' on the GPU node", a.python,
            away=f"not for {a.python} here; checked again on the GPU node")
    if not a.standin:
        need = sorted({int(g) for s in servers for g in s.gpus.split(",")})
        # plan() refused indices beyond the count already
        add(n_gpus is not None, "GPUs", "nvidia-smi not found: no NVIDIA GPUs on this machine (MMCF_GPU_COUNT overrides)",
            f"{n_gpus} on this machine; the plan uses {len(need)}",
            away=f"no nvidia-smi on this machine (a launch refuses that): the plan needs GPU indices "
                 f"{need[0]}..{need[-1]} ({len(need)} GPUs) on the node; MMCF_GPU_COUNT overrides")
    for s in servers:
        if _is_local(s.size):
            add((Path(s.weights) / "config.json").is_file(), f"weights for {s.size}",
                f"weights for {s.size} not found: {s.weights}/config.json is missing "
                f"(MODEL_DIR / QWEN35_{s.size.upper().replace('-', '_')}_PATH)", s.weights,
                away=f"{s.weights}/config.json is not on this machine; checked again on the GPU node")
        else:
            out.append(("unchecked", f"weights for {s.size}", f"{s.weights}: a hub id, fetched by SGLang on the node"))
    for what, port in ports:
        add(_port_free(port), f"port {port} ({what})",
            f"port {port} is already in use ({what}; choose other --port / --router-port / --prometheus-port / "
            "--nccl-port bases)")
    if routers and not os.environ.get("MMCF_SGLANG_ROUTER_CMD"):
        renv = {**os.environ, "PYTHONPATH": str(SGLANG_SITE)} if a.standin else None
        add(not subprocess.run([a.python, "-c", "import sglang_router"], capture_output=True, env=renv).returncode,
            "sglang-router imports", "sglang-router is not installed: pip install -e '.[serve]'",
            away="not here; checked again on the GPU node")
    return out


def launch(a) -> int:
    servers = plan(a)
    gpu_gb = _gpu_mem_gb()
    run_dir = Path(a.run_dir).resolve()
    for s in servers:
        s.log = str(run_dir / f"{s.name}.log")
    sem = ("raw log_softmax(logits): SGLANG_RETURN_ORIGINAL_LOGPROB=1" if a.logprobs == "raw"
           else "log_softmax(logits / T), SGLang's default")
    print(f"logprob semantics: {a.logprobs} ({sem}); clients: --logprob-mode {a.logprobs}")
    print(f"deterministic inference: {'on (--enable-deterministic-inference: seeds are honoured)' if a.deterministic else 'off (seeds are ignored by the server)'}")
    routers = _router_plan(a, servers)
    ports = ports_of(servers, routers)
    print("ports: " + ", ".join(f"{what} {p}" for what, p in ports))
    if a.standin:
        print(f"stand-in: SGLang's own HTTP server / TokenizerManager / DetokenizerManager from {SGLANG_SITE}, the "
              f"scheduler is serving/standin.py ({a.standin} mode) on the CPU: the numbers are meaningless")
    if a.dry_run:
        for s in servers:
            print(_quote(["env", *(f"{k}={v}" for k, v in s.env.items()), *s.cmd]))
        for _, port, urls, prom in routers:
            print(_quote(router_command(urls, port, a, prom)))
        for s in servers:
            print("\n".join(_describe(a, s, gpu_gb, run_dir)))
    # ------------------------------------------------ preflight: fail early and clearly, start nothing
    checks = preflight(a, servers, routers, ports)
    failed = [c for c in checks if c[0] == "FAIL"]
    if not a.dry_run:  # a launch refuses what it cannot check: it needs the node
        failed += [("FAIL", c[1], c[3]) for c in checks if c[0] == "unchecked" and len(c) > 3]
    if a.dry_run:  # every check a launch makes, each reported (the plan above is printed either way)
        for state, what, detail, *_ in checks:
            print(f"check {state:9s} {what}" + (f": {detail}" if detail else ""))
        if failed:
            print(f"launch_qwen35: --dry-run: {len(failed)} check(s) would stop this launch here", file=sys.stderr)
            return 1
        return 0
    if failed:
        raise LaunchError(failed[0][2])
    run_dir.mkdir(parents=True, exist_ok=True)
    _remember(run_dir)
    started: list[tuple[str, subprocess.Popen]] = []
    entries: list[dict] = []

    def fail(msg: str) -> int:
        print(f"launch_qwen35: {msg}", file=sys.stderr)
        print("launch_qwen35: stopping the servers started by this launch", file=sys.stderr)
        for name, p in started:
            _kill_group(p.pid)
            (run_dir / f"{name}.pid").unlink(missing_ok=True)
        for e in entries:
            e["status"] = "stopped"
        if entries:
            _write_endpoints(run_dir, entries)
        return 1

    procs = {}
    for s in servers:
        (run_dir / f"{s.name}.cmd").write_text(_quote(["env", *(f"{k}={v}" for k, v in s.env.items()), *s.cmd]) + "\n")
        print(f"starting {s.name} on GPUs {s.gpus} (log: {s.log})", flush=True)
        p = _start(s.cmd, s.env, s.log)
        (run_dir / f"{s.name}.pid").write_text(pid_record(p.pid))
        started.append((s.name, p))
        procs[s.name] = p
    for s in servers:
        url = f"http://127.0.0.1:{s.port}"
        try:
            model = _wait_ready(url, procs[s.name], s.log, s.name, a.timeout)
        except LaunchError as e:
            return fail(str(e))
        print(f"ready: {url}  model={model}  logprobs={a.logprobs}  GPUs={s.gpus}", flush=True)
        entries.append({"url": _client_url(a, s.port), "model": model, "served_model": model, "weights": s.weights,
                        "size": s.size, "logprob_mode": a.logprobs, "gpus": s.gpus, "deterministic": a.deterministic,
                        "pid": procs[s.name].pid, "log": s.log, "status": "running", "kind": "server",
                        "nccl_port": s.nccl_port, "standin": a.standin})
        _write_endpoints(run_dir, entries)
    for served, port, urls, prom in routers:
        name = f"router-{port}"
        cmd = router_command(urls, port, a, prom)
        (run_dir / f"{name}.cmd").write_text(_quote(cmd) + "\n")
        log = str(run_dir / f"{name}.log")
        p = _start(cmd, {"PYTHONPATH": str(SGLANG_SITE)} if a.standin else {}, log)
        (run_dir / f"{name}.pid").write_text(pid_record(p.pid))
        started.append((name, p))
        t0 = time.time()
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5).read()
                break
            except Exception:  # noqa: BLE001 - not up yet
                if p.poll() is not None or time.time() - t0 > a.timeout:
                    return fail(f"the router for {served} did not come up; see {log}")
                time.sleep(0.5)
        print(f"ready: router http://127.0.0.1:{port} for {served} over {' '.join(urls)} (policy cache_aware)", flush=True)
        entries.append({"url": _client_url(a, port), "model": served, "served_model": served, "router_of": urls,
                        "prometheus_port": prom,
                        "size": next(s.size for s in servers if s.served == served), "logprob_mode": a.logprobs,
                        "gpus": "", "deterministic": a.deterministic, "pid": p.pid, "log": log, "status": "running",
                        "kind": "router"})
        _write_endpoints(run_dir, entries)
    print(f"\nendpoints written to {run_dir / 'endpoints.json'}")
    for s in servers:
        print("\n".join(_describe(a, s, gpu_gb, run_dir)))
    for served, port, _, _ in routers:
        url = _client_url(a, port)
        w = next(s.weights for s in servers if s.served == served)
        print(f"router for {served}: clients: --backend sglang --endpoint {url} --model-dir {shlex.quote(w)} "
              f"--logprob-mode {a.logprobs}")
    return 0


def _router_plan(a, servers: list[Server]) -> list[tuple[str, int, list[str]]]:
    """One router per served model (a router over several models would send requests to any of them)."""
    if not a.router:
        return []
    by_model: dict[str, list[str]] = {}
    for s in servers:
        by_model.setdefault(s.served, []).append(f"http://127.0.0.1:{s.port}")
    return [(m, a.router_port + j, urls, a.prometheus_port + j) for j, (m, urls) in enumerate(by_model.items())]


def ports_of(servers: list[Server], routers: list) -> list[tuple[str, int]]:
    """Every port the launch binds, named; refused when two coincide."""
    out = [(f"{s.name} http", s.port) for s in servers] + [(f"{s.name} nccl", s.nccl_port) for s in servers if s.nccl_port]
    out += [(f"router-{port} http", port) for _, port, _, _ in routers]
    out += [(f"router-{port} prometheus", prom) for _, port, _, prom in routers]
    seen: dict = {}
    for what, p in out:
        if p in seen:
            raise LaunchError(f"port {p} is planned twice ({seen[p]} and {what}): choose other --port / --router-port / "
                              "--prometheus-port / --nccl-port bases")
        seen[p] = what
    return out


def _quote(words: list[str]) -> str:
    return " ".join(w if all(c.isalnum() or c in "_@%+=:,./-" for c in w) and w else shlex.quote(w) for w in words)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="bash serving/launch_qwen35.sh", description="SGLang servers for the Qwen3.5 backbones (paper B.1), "
        "one per MODEL, each on its own group of --tp GPUs.",
        formatter_class=lambda prog: argparse.RawDescriptionHelpFormatter(prog, max_help_position=32),
        epilog="examples:\n  MODEL_DIR=/models bash serving/launch_qwen35.sh            # 9b on GPUs 0-3, 27b on 4-7\n"
               "  bash serving/launch_qwen35.sh --dry-run --tp 8 --gpu-groups 0,1,2,3,4,5,6,7 27b\n"
               "then: bash serving/stop.sh --run-dir .serve")
    ap.add_argument("models", nargs="*", metavar="MODEL", help=f"one of {', '.join(MODELS)} (default: 9b 27b)")
    ap.add_argument("--dry-run", action="store_true", help="print the exact commands, client flags and memory estimate; start nothing")
    ap.add_argument("--logprobs", "--logprob-mode", dest="logprobs", default="scaled", choices=("scaled", "raw"),
                    help="what output logprobs describe: scaled = log_softmax(logits/T) (SGLang's default); raw sets "
                         "SGLANG_RETURN_ORIGINAL_LOGPROB=1 (default: scaled)")
    ap.add_argument("--tp", type=int, default=4, help="tensor-parallel size per server (default: 4)")
    ap.add_argument("--gpu-groups", default="", help='one comma-separated GPU list per server, e.g. "0,1,2,3 4,5,6,7" '
                                                     "(default: consecutive blocks of --tp)")
    ap.add_argument("--port", type=int, default=30000, help="first port (default: 30000)")
    ap.add_argument("--host", default="0.0.0.0", help="listen address (default: 0.0.0.0)")
    ap.add_argument("--advertise-host", metavar="HOST",
                    help="the name other nodes reach this one by, written into endpoints.json (several nodes behind "
                         "one gateway: python -m serving.gateway; default: 127.0.0.1 when listening on 0.0.0.0)")
    ap.add_argument("--mem-fraction", type=float, default=0.85, help="--mem-fraction-static (default: 0.85)")
    ap.add_argument("--context-length", type=int, default=131072, help="(default: 131072)")
    ap.add_argument("--deterministic", action="store_true",
                    help="--enable-deterministic-inference: seeds become reproducible (slower; default: off)")
    ap.add_argument("--timeout", type=float, default=1800, help="readiness wait per server, seconds (default: 1800)")
    ap.add_argument("--run-dir", default=os.environ.get("MMCF_SERVE_DIR", ".serve"),
                    help="logs, PID files, commands, endpoints.json (default: .serve)")
    ap.add_argument("--router", action="store_true", help="also start one sglang-router (cache_aware) per model")
    ap.add_argument("--router-port", type=int, default=30100, help="first router port (default: 30100)")
    ap.add_argument("--prometheus-port", type=int, default=29000,
                    help="first router's metrics port; router j gets +j (default: 29000, sglang-router's own default)")
    ap.add_argument("--nccl-port", type=int, default=None,
                    help="first server's NCCL / dist-init port; server i gets +i (default: --port + 1000)")
    ap.add_argument("--standin", choices=("scripted", "model"),
                    help="no GPU: SGLang's real front end on the CPU with serving/standin.py as its scheduler and the "
                         "embedded tiny Qwen3.5 for every model (needs bash scripts/sglang_conformance.sh); routers are "
                         "the real sglang-router")
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    a.python = os.environ.get("PYTHON") or sys.executable
    bad = [m for m in a.models if m not in MODELS]
    if bad:
        print(f"launch_qwen35: unknown model {bad[0]!r}; the models are: {', '.join(MODELS)}", file=sys.stderr)
        return 2
    a.models = a.models or ["9b", "27b"]
    if a.tp < 1:
        print("launch_qwen35: --tp must be a positive integer", file=sys.stderr)
        return 2
    try:
        return launch(a)
    except LaunchError as e:
        print(f"launch_qwen35: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
