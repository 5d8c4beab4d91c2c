#!/usr/bin/env bash
# SGLang servers for the paper's Qwen3.5 backbones: bash serving/launch_qwen35.sh [options] [MODEL ...]
# (MODEL: 9b | 27b | 35b-a3b; --help for the options). The launcher is serving/launch.py.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" -m serving.launch "$@"
