#!/usr/bin/env bash
# The adaptive image unloading end to end (ours; agent/methods/unload.py): a ReAct run with the images kept -> its
# teacher-forced influences and step-k removal replays -> the calibration of ε and M -> adaptive runs at the
# calibrated ε and around it -> judge -> the unloading figure.
#
#   bash scripts/reproduce_unload.sh --demo
#       on the SCRIPTED FAKE model (planted: images matter for 1, 2 or 4 steps by category); every number
#       is fake and every figure is stamped so (~1 min). --demo-model tiny: the embedded random Qwen3.5
#       instead (its actions never parse and every answer is wrong, so the calibration has nothing to
#       separate: the adaptive runs then use the built-in default ε).
#   bash scripts/reproduce_unload.sh --benchmark DATA/mmsearch --endpoint http://gpu:30000 \
#       --model-dir /models/Qwen3.5-27B [--out runs/unload-27b] [--steps 1..8] [--eps "0.5x 2x"] [--limit N]
#       against a served Qwen3.5 (SGLang native: scoring needs it), live tools and the paper's judge;
#       --eps lists the extra ε to run as multiples of the calibrated one.
#
# Every step is resumable: rerunning the script continues where it stopped.
set -euo pipefail
cd "$(dirname "$0")/.."

DEMO=0 DEMO_MODEL=scripted BENCHMARK="" ENDPOINT="" MODEL_DIR="" OUT="" STEPS="1..6" EPS="0.25x 4x" LIMIT=""
usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --demo) DEMO=1 ;;
    --demo-model) DEMO_MODEL="$2"; shift ;;
    --benchmark) BENCHMARK="$2"; shift ;;
    --endpoint) ENDPOINT="$2"; shift ;;
    --model-dir) MODEL_DIR="$2"; shift ;;
    --out) OUT="$2"; shift ;;
    --steps) STEPS="$2"; shift ;;
    --eps) EPS="$2"; shift ;;
    --limit) LIMIT="$2"; shift ;;
    -h|--help) usage 0 ;;
    *) echo "unknown argument: $1" >&2; usage 2 ;;
  esac
  shift
done

PY=${PYTHON:-python}
if [[ -x .venv/bin/python && -z "${PYTHON:-}" ]]; then PY=.venv/bin/python; fi
LIMIT_ARGS=()
[[ -n "$LIMIT" ]] && LIMIT_ARGS=(--limit "$LIMIT")

if [[ "$DEMO" == 1 ]]; then
  JUDGE_ARGS=(--judge exact)
  if [[ "$DEMO_MODEL" == tiny ]]; then
    OUT=${OUT:-runs/unload-demo-tiny}
    echo "== DEMO on the embedded default: a tiny RANDOMLY INITIALISED model; all numbers are meaningless =="
    BACKEND=(--backend local)
    RUN_ARGS=(--benchmark demo --t-max 5 --max-tokens 24)
    ENTROPY_ARGS=(--include-unparsed)
  else
    OUT=${OUT:-runs/unload-demo}
    echo "== DEMO on the SCRIPTED FAKE backend: planted behaviour and distributions; all numbers are fake =="
    BACKEND=(--backend scripted)
    RUN_ARGS=(--benchmark demo)
    ENTROPY_ARGS=()
  fi
else
  [[ -n "$BENCHMARK" && -n "$ENDPOINT" && -n "$MODEL_DIR" ]] || { echo "need --benchmark, --endpoint and --model-dir (or --demo)" >&2; exit 2; }
  OUT=${OUT:-runs/unload-$(basename "$MODEL_DIR")}
  BACKEND=(--backend sglang --endpoint "$ENDPOINT" --model-dir "$MODEL_DIR")
  RUN_ARGS=(--benchmark "$BENCHMARK" --tools live --concurrency 32)
  ENTROPY_ARGS=()
  JUDGE_ARGS=()
  "$PY" -m agent.preflight --benchmark "$BENCHMARK" "${BACKEND[@]}" --tools live \
    --judge-api-key-env "${JUDGE_API_KEY_ENV:-OPENROUTER_API_KEY}"
fi

REACT="$OUT/react"
CAL="$REACT/probes/calibrate_unload/calibration.json"
set -x
"$PY" -m agent.run --method react --out "$REACT" "${BACKEND[@]}" "${RUN_ARGS[@]}" "${LIMIT_ARGS[@]}" --no-progress
"$PY" -m probes.entropy "$REACT" --mode teacher-forced "${ENTROPY_ARGS[@]}" --no-progress
"$PY" -m probes.removal "$REACT" --steps "$STEPS" "${JUDGE_ARGS[@]}" --no-progress
"$PY" -m agent.judge "$REACT" "${JUDGE_ARGS[@]}" --no-progress
set +x
RUNS=()
if "$PY" -m probes.calibrate_unload "$REACT"; then
  BASE=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['chosen']['threshold'])" "$CAL")
  POLICIES=("$CAL")
  for m in $EPS; do POLICIES+=("$("$PY" -c 'import sys; print("%.3g" % (float(sys.argv[1]) * float(sys.argv[2].rstrip("x"))))' "$BASE" "$m")"); done
else
  echo "calibration not possible on this run (see above): the adaptive runs use the built-in default ε and M" >&2
  POLICIES=("")
fi
for p in "${POLICIES[@]}"; do
  if [[ "$p" == "$CAL" ]]; then name=calibrated; elif [[ -z "$p" ]]; then name=default; else name="eps$p"; fi
  args=(); [[ -n "$p" ]] && args=(--unload-threshold "$p")
  [[ "$p" != "$CAL" && -f "$CAL" ]] && args+=(--unload-patience "$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['chosen']['patience'])" "$CAL")")
  set -x
  "$PY" -m agent.run --method react --image-unload adaptive "${args[@]}" --out "$OUT/adaptive-$name" \
    "${BACKEND[@]}" "${RUN_ARGS[@]}" "${LIMIT_ARGS[@]}" --no-progress
  "$PY" -m agent.judge "$OUT/adaptive-$name" "${JUDGE_ARGS[@]}" --no-progress
  set +x
  RUNS+=("$OUT/adaptive-$name")
done
set -x
"$PY" -m analysis.report --react "$REACT" --unload-runs "${RUNS[@]}" --out "$OUT/figures" ${JUDGE_ARGS[@]+"${JUDGE_ARGS[@]}"}
set +x
echo
echo "wrote:"
echo "  $OUT/figures/fig_unload.png (+ .pdf; the numbers: fig_release_points.csv, fig_release_steps.csv)"
[[ -f "$CAL" ]] && echo "  $CAL (the calibrated ε and M; use it with --unload-threshold)"
for r in "${RUNS[@]}"; do echo "  $r/ (an adaptive run)"; done
echo "look at a run: $PY -m agent.show ${RUNS[0]}"
