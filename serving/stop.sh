#!/usr/bin/env bash
# Stop the servers serving/launch_qwen35.sh started, and nothing else: bash serving/stop.sh [--serve-dir DIR]
# (--help for the options). The implementation is serving/stop.py.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" -m serving.stop "$@"
