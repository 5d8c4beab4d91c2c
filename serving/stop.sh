#!/usr/bin/env bash
# Stop the servers (and router) that serving/launch_qwen35.sh started, and nothing else.
#
#   bash serving/stop.sh [--run-dir DIR] [--timeout S]
#
# Reads DIR/*.pid (default .serve, or $MMCF_SERVE_DIR); a PID is signalled only if that process is still
# the one the launcher started (its command line carries the port recorded in DIR/<name>.cmd). Each
# server's process group gets SIGTERM, then SIGKILL after --timeout seconds (default 30).
set -euo pipefail
RUN_DIR=${MMCF_SERVE_DIR:-.serve} TIMEOUT=30
while [[ $# -gt 0 ]]; do
  case "$1" in
    --run-dir) RUN_DIR=${2:?}; shift ;;
    --timeout) TIMEOUT=${2:?}; shift ;;
    -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "stop.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done
shopt -s nullglob
pids=("$RUN_DIR"/*.pid)
if [[ ${#pids[@]} -eq 0 ]]; then
  echo "stop.sh: no servers recorded in $RUN_DIR"
  exit 0
fi
for f in "${pids[@]}"; do
  name=$(basename "$f" .pid)
  pid=$(cat "$f")
  port=${name##*-}
  if [[ ! -r "/proc/$pid/cmdline" ]]; then
    echo "$name: not running (pid $pid)"; rm -f "$f"; continue
  fi
  cmdline=$(tr '\0' ' ' < "/proc/$pid/cmdline")
  if [[ "$cmdline" != *"$port"* ]]; then
    echo "$name: pid $pid now belongs to another program; left alone"; rm -f "$f"; continue
  fi
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < TIMEOUT * 10; i++)); do
    [[ -e "/proc/$pid" ]] && [[ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]] || break
    sleep 0.1
  done
  if [[ -e "/proc/$pid" && "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]]; then
    kill -KILL -- "-$pid" 2>/dev/null || true
    echo "$name: killed (pid $pid did not stop within ${TIMEOUT}s)"
  else
    echo "$name: stopped (pid $pid)"
  fi
  rm -f "$f"
done
