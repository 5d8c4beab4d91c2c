#!/usr/bin/env bash
# SGLang servers for the paper's Qwen3.5 backbones (paper B.1): tensor parallel on an 8-GPU node, top-20 logprobs.
#
#   bash serving/launch_qwen35.sh [options] [MODEL ...]        MODEL: 9b | 27b | 35b-a3b   (default: 9b 27b)
#
# One server per MODEL, each on its own GPU group (default groups "0,1,2,3" and "4,5,6,7", TP 4), ports
# 30000, 30001, ... Weights: $QWEN35_9B_PATH / $QWEN35_27B_PATH / $QWEN35_35B_A3B_PATH, else
# $MODEL_DIR/Qwen3.5-9B (…-27B, …-35B-A3B), else the hub id Qwen/Qwen3.5-9B (…).
#
# Options:
#   --dry-run               print the exact commands (with their environment) and start nothing
#   --logprobs scaled|raw   what output logprobs describe (default scaled = SGLang's default,
#                           log_softmax(logits/T); raw sets SGLANG_RETURN_ORIGINAL_LOGPROB=1)
#   --tp N                  tensor-parallel size per server (default 4)
#   --gpu-groups "G ..."    one comma-separated GPU list per server, e.g. "0,1,2,3 4,5,6,7" or "0,1,2,3,4,5,6,7"
#   --port P                first port (default 30000)           --host H   (default 0.0.0.0)
#   --mem-fraction F        --mem-fraction-static (default 0.85)  --context-length N (default 131072)
#   --timeout S             readiness wait per server (default 1800)
#   --run-dir DIR           logs, PID files, endpoints.json (default .serve)
#   --router                also start the SGLang router over all servers (cache_aware), on --router-port
#   --router-port P         (default 30100)
# Environment: SGLANG_EXTRA_ARGS (appended to every server), MMCF_SGLANG_SERVER_CMD (replaces
# "python -m sglang.launch_server": a stand-in for tests), MMCF_GPU_COUNT (overrides nvidia-smi),
# PYTHON (default python3).
#
# After launch: python -m serving.check --endpoint http://HOST:PORT   (the smoke test); stop with
# bash serving/stop.sh [--run-dir DIR]  (stops only the servers started here).
set -euo pipefail

PYTHON=${PYTHON:-python3}
DRY_RUN=0 LOGPROBS=scaled TP=4 GPU_GROUPS="" PORT=30000 HOST=0.0.0.0 MEM_FRACTION=0.85 CONTEXT_LENGTH=131072
TIMEOUT=1800 RUN_DIR=${MMCF_SERVE_DIR:-.serve} ROUTER=0 ROUTER_PORT=30100
MODELS=()

die() { echo "launch_qwen35: $*" >&2; exit 1; }
usage() { sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) DRY_RUN=1 ;;
    --logprobs) LOGPROBS=${2:?}; shift ;;
    --tp) TP=${2:?}; shift ;;
    --gpu-groups) GPU_GROUPS=${2:?}; shift ;;
    --port) PORT=${2:?}; shift ;;
    --host) HOST=${2:?}; shift ;;
    --mem-fraction) MEM_FRACTION=${2:?}; shift ;;
    --context-length) CONTEXT_LENGTH=${2:?}; shift ;;
    --timeout) TIMEOUT=${2:?}; shift ;;
    --run-dir) RUN_DIR=${2:?}; shift ;;
    --router) ROUTER=1 ;;
    --router-port) ROUTER_PORT=${2:?}; shift ;;
    -h|--help) usage 0 ;;
    9b|27b|35b-a3b) MODELS+=("$1") ;;
    *) echo "launch_qwen35: unknown argument '$1'" >&2; usage 2 ;;
  esac
  shift
done
[[ ${#MODELS[@]} -gt 0 ]] || MODELS=(9b 27b)
[[ "$LOGPROBS" == scaled || "$LOGPROBS" == raw ]] || die "--logprobs must be scaled or raw, got '$LOGPROBS'"
[[ "$TP" =~ ^[1-9][0-9]*$ ]] || die "--tp must be a positive integer, got '$TP'"

# GPU groups: given, or consecutive blocks of TP GPUs
read -r -a GROUPS_ARR <<< "$GPU_GROUPS"
if [[ ${#GROUPS_ARR[@]} -eq 0 ]]; then
  for i in "${!MODELS[@]}"; do
    g=""
    for ((j = i * TP; j < (i + 1) * TP; j++)); do g+="${g:+,}$j"; done
    GROUPS_ARR+=("$g")
  done
fi
[[ ${#GROUPS_ARR[@]} -ge ${#MODELS[@]} ]] || die "${#MODELS[@]} model(s) but only ${#GROUPS_ARR[@]} GPU group(s) in --gpu-groups"

hub_id() { case "$1" in 9b) echo Qwen/Qwen3.5-9B ;; 27b) echo Qwen/Qwen3.5-27B ;; 35b-a3b) echo Qwen/Qwen3.5-35B-A3B ;; esac; }
served_name() { echo "qwen3.5-$1"; }
weights_var() { echo "QWEN35_$(echo "$1" | tr 'a-z-' 'A-Z_')_PATH"; }
weights_for() {
  local m=$1 var path
  var=$(weights_var "$m")
  path=${!var:-}
  if [[ -z "$path" && -n "${MODEL_DIR:-}" ]]; then path="$MODEL_DIR/$(basename "$(hub_id "$m")")"; fi
  echo "${path:-$(hub_id "$m")}"
}
weights_local() { local var; var=$(weights_var "$1"); [[ -n "${!var:-}" || -n "${MODEL_DIR:-}" ]]; }

if [[ -n "${MMCF_SGLANG_SERVER_CMD:-}" ]]; then
  read -r -a SERVER_CMD <<< "$MMCF_SGLANG_SERVER_CMD"
else
  SERVER_CMD=("$PYTHON" -m sglang.launch_server)
fi
read -r -a EXTRA <<< "${SGLANG_EXTRA_ARGS:-}"

server_cmd() {  # MODEL PORT -> the command line (one word per line)
  local m=$1 port=$2
  printf '%s\n' "${SERVER_CMD[@]}" --model-path "$(weights_for "$m")" --served-model-name "$(served_name "$m")" \
    --tp-size "$TP" --host "$HOST" --port "$port" --reasoning-parser qwen3 \
    --mem-fraction-static "$MEM_FRACTION" --context-length "$CONTEXT_LENGTH" ${EXTRA[@]+"${EXTRA[@]}"}
}
env_for() {  # GPU group -> the environment the server gets
  local env=("CUDA_VISIBLE_DEVICES=$1")
  [[ "$LOGPROBS" == raw ]] && env+=("SGLANG_RETURN_ORIGINAL_LOGPROB=1")
  printf '%s\n' "${env[@]}"
}
quote() {  # words as a shell would need them typed (plain words stay plain)
  local out=() w
  for w in "$@"; do
    if [[ "$w" =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then out+=("$w"); else out+=("$(printf '%q' "$w")"); fi
  done
  echo "${out[*]}"
}

echo "logprob semantics: $LOGPROBS ($([[ "$LOGPROBS" == raw ]] && echo "raw log_softmax(logits): SGLANG_RETURN_ORIGINAL_LOGPROB=1" || echo "log_softmax(logits / T), SGLang's default")); clients: --logprob-mode $LOGPROBS"

if [[ "$DRY_RUN" == 1 ]]; then
  for i in "${!MODELS[@]}"; do
    mapfile -t cmd < <(server_cmd "${MODELS[$i]}" $((PORT + i)))
    mapfile -t envs < <(env_for "${GROUPS_ARR[$i]}")
    quote env "${envs[@]}" "${cmd[@]}"
  done
  if [[ "$ROUTER" == 1 ]]; then
    urls=(); for i in "${!MODELS[@]}"; do urls+=("http://127.0.0.1:$((PORT + i))"); done
    quote "$PYTHON" -m sglang_router.launch_router --worker-urls "${urls[@]}" --policy cache_aware --host "$HOST" --port "$ROUTER_PORT"
  fi
  exit 0
fi

# ------------------------------------------------------------------ preflight: fail early and clearly
if [[ -z "${MMCF_SGLANG_SERVER_CMD:-}" ]]; then
  "$PYTHON" -c "import sglang" 2>/dev/null || die "sglang is not installed for $PYTHON: pip install -e '.[serve]' on the GPU node"
fi
if [[ -n "${MMCF_GPU_COUNT:-}" ]]; then
  n_gpus=$MMCF_GPU_COUNT
elif command -v nvidia-smi >/dev/null 2>&1; then
  n_gpus=$(nvidia-smi -L | grep -c '^GPU ' || true)
else
  die "nvidia-smi not found: no NVIDIA GPUs on this machine"
fi
for i in "${!MODELS[@]}"; do
  IFS=, read -r -a ids <<< "${GROUPS_ARR[$i]}"
  [[ ${#ids[@]} -eq "$TP" ]] || die "GPU group '${GROUPS_ARR[$i]}' has ${#ids[@]} GPUs but --tp is $TP"
  for g in "${ids[@]}"; do
    [[ "$g" =~ ^[0-9]+$ && "$g" -lt "$n_gpus" ]] || die "GPU $g requested (group '${GROUPS_ARR[$i]}') but this machine has $n_gpus GPU(s)"
  done
  w=$(weights_for "${MODELS[$i]}")
  if weights_local "${MODELS[$i]}"; then
    [[ -f "$w/config.json" ]] || die "weights for ${MODELS[$i]} not found: $w/config.json is missing (MODEL_DIR / $(weights_var "${MODELS[$i]}"))"
  fi
  p=$((PORT + i))
  "$PYTHON" - "$p" <<'EOF' || die "port $p is already in use (choose another with --port)"
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("0.0.0.0", int(sys.argv[1])))
except OSError:
    sys.exit(1)
EOF
done
if [[ "$ROUTER" == 1 ]]; then
  "$PYTHON" -c "import sglang_router" 2>/dev/null || [[ -n "${MMCF_SGLANG_ROUTER_CMD:-}" ]] || die "sglang-router is not installed: pip install -e '.[serve]'"
fi

mkdir -p "$RUN_DIR"
wait_ready() {  # URL PID LOG NAME -> prints the served model id
  "$PYTHON" - "$1" "$2" "$3" "$TIMEOUT" "$4" <<'EOF'
import json, os, sys, time, urllib.request
url, pid, log, timeout, name = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4]), sys.argv[5]
deadline, last = time.time() + timeout, ""
def alive():
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a zombie (exited, not yet reaped) is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return True
while time.time() < deadline:
    if not alive():
        tail = open(log, errors="replace").read()[-2000:] if os.path.exists(log) else ""
        sys.exit(f"{name}: the server exited before it was ready; last log lines ({log}):\n{tail}")
    try:
        urllib.request.urlopen(url + "/health_generate", timeout=10).read()
        models = json.load(urllib.request.urlopen(url + "/v1/models", timeout=10))
        print(models["data"][0]["id"])
        sys.exit(0)
    except Exception as e:  # not up yet
        last = str(e)
        time.sleep(2 if timeout > 30 else 0.2)
sys.exit(f"{name}: not ready after {timeout:g}s ({url}/health_generate: {last}); see {log}")
EOF
}

started=()
cleanup_on_failure() {
  echo "launch_qwen35: stopping the servers started by this launch" >&2
  for n in "${started[@]}"; do
    pid=$(cat "$RUN_DIR/$n.pid" 2>/dev/null || true)
    [[ -n "$pid" ]] && kill -TERM -- "-$pid" 2>/dev/null || true
    rm -f "$RUN_DIR/$n.pid"
  done
}

endpoints=()
for i in "${!MODELS[@]}"; do
  m=${MODELS[$i]}; p=$((PORT + i)); name="qwen3.5-$m-$p"
  mapfile -t cmd < <(server_cmd "$m" "$p")
  mapfile -t envs < <(env_for "${GROUPS_ARR[$i]}")
  quote env "${envs[@]}" "${cmd[@]}" > "$RUN_DIR/$name.cmd"
  echo "starting $name on GPUs ${GROUPS_ARR[$i]} (log: $RUN_DIR/$name.log)"
  setsid env "${envs[@]}" "${cmd[@]}" > "$RUN_DIR/$name.log" 2>&1 < /dev/null &
  echo $! > "$RUN_DIR/$name.pid"
  started+=("$name")
done
for i in "${!MODELS[@]}"; do
  m=${MODELS[$i]}; p=$((PORT + i)); name="qwen3.5-$m-$p"
  url="http://127.0.0.1:$p"
  if ! model=$(wait_ready "$url" "$(cat "$RUN_DIR/$name.pid")" "$RUN_DIR/$name.log" "$name"); then
    cleanup_on_failure
    exit 1
  fi
  echo "ready: $url  model=$model  logprobs=$LOGPROBS  GPUs=${GROUPS_ARR[$i]}"
  endpoints+=("{\"url\": \"$url\", \"model\": \"$model\", \"size\": \"$m\", \"logprob_mode\": \"$LOGPROBS\", \"gpus\": \"${GROUPS_ARR[$i]}\"}")
done

if [[ "$ROUTER" == 1 ]]; then
  urls=(); for i in "${!MODELS[@]}"; do urls+=("http://127.0.0.1:$((PORT + i))"); done
  if [[ -n "${MMCF_SGLANG_ROUTER_CMD:-}" ]]; then read -r -a rcmd <<< "$MMCF_SGLANG_ROUTER_CMD"; else rcmd=("$PYTHON" -m sglang_router.launch_router); fi
  rcmd+=(--worker-urls "${urls[@]}" --policy cache_aware --host "$HOST" --port "$ROUTER_PORT")
  name="router-$ROUTER_PORT"
  quote "${rcmd[@]}" > "$RUN_DIR/$name.cmd"
  setsid "${rcmd[@]}" > "$RUN_DIR/$name.log" 2>&1 < /dev/null &
  echo $! > "$RUN_DIR/$name.pid"
  started+=("$name")
  "$PYTHON" - "http://127.0.0.1:$ROUTER_PORT" "$TIMEOUT" <<'EOF' || { cleanup_on_failure; die "the router did not come up; see $RUN_DIR/$name.log"; }
import sys, time, urllib.request
url, deadline = sys.argv[1], time.time() + float(sys.argv[2])
while time.time() < deadline:
    try:
        urllib.request.urlopen(url + "/v1/models", timeout=5).read()
        sys.exit(0)
    except Exception:
        time.sleep(0.5)
sys.exit(1)
EOF
  echo "ready: router http://127.0.0.1:$ROUTER_PORT over ${urls[*]} (policy cache_aware)"
  endpoints+=("{\"url\": \"http://127.0.0.1:$ROUTER_PORT\", \"model\": \"router\", \"size\": \"router\", \"logprob_mode\": \"$LOGPROBS\", \"gpus\": \"\"}")
fi

{ echo "["; (IFS=,; echo "${endpoints[*]}"); echo "]"; } > "$RUN_DIR/endpoints.json"
echo "endpoints written to $RUN_DIR/endpoints.json; smoke test: python -m serving.check --endpoint http://127.0.0.1:$PORT"
echo "agents and probes: --backend sglang --endpoint URL --model-dir WEIGHTS --logprob-mode $LOGPROBS"
