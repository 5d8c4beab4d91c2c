#!/usr/bin/env bash
# One shard of a run per Slurm array task (docs/serving.md: "Scaling out"). An example to copy and edit, not a scheduler:
#
#   mkdir -p logs && sbatch --array=0-7 scripts/slurm_array.sh     # from the repository: 8 shards, 0..7
#   # when every task has finished:
#   python -m agent.rundir merge runs/react-27b runs/react-27b.shard-*
#
# Each task is one client (a CPU job: the GPUs sit behind the gateway), writing its own run directory with its
# own tool cache (SQLite's WAL mode does not work over a network filesystem, so shards never share one). A task
# that is preempted, cancelled or fails is resubmitted alone with the array's size given (an array of one task
# counts 1): SHARDS=8 sbatch --array=3 scripts/slurm_array.sh; the runner resumes its shard. tests/test_slurm.py
# runs all of this under a real one-node Slurm.
#
# Edit the variables below, or set them in the environment. Outside Slurm the same script runs one shard with
# SLURM_ARRAY_TASK_ID / SLURM_ARRAY_TASK_COUNT set by hand (the test suite does exactly that).
#SBATCH --job-name=mmcf-shard
#SBATCH --cpus-per-task=4
#SBATCH --mem=16G
#SBATCH --time=24:00:00
#SBATCH --output=logs/%x-%A_%a.out
set -euo pipefail

: "${SLURM_ARRAY_TASK_ID:?run under sbatch --array=0-(N-1), or set SLURM_ARRAY_TASK_ID and SLURM_ARRAY_TASK_COUNT}"
# Slurm sets SLURM_ARRAY_TASK_COUNT for --array=0-(N-1); SHARDS overrides it (e.g. with a %limit on the array)
N="${SHARDS:-${SLURM_ARRAY_TASK_COUNT:?set SHARDS=N}}"
I="$SLURM_ARRAY_TASK_ID"
if (( I >= N )); then
  echo "slurm_array.sh: task $I of an array of $N; one task of a larger array is resubmitted with the array's size:" \
       "SHARDS=<the array's size> sbatch --array=$I scripts/slurm_array.sh" >&2
  exit 2
fi

METHOD="${METHOD:-react}"
BENCHMARK="${BENCHMARK:-demo}"                        # e.g. data/mmsearch (a benchmark dir or data_unified.jsonl)
OUT="${OUT:-runs/$METHOD-$BENCHMARK}"                  # the merged run; shards go to $OUT.shard-I
SEED="${SEED:-20260101}"                               # the same in every shard: required by --shard
TRIALS="${TRIALS:-3}"                                  # paper: 3
GATEWAY="${GATEWAY:-}"                                 # the SGLang gateway of the model (python -m serving.gateway)
MODEL_DIR="${MODEL_DIR:-}"                             # the model's directory (chat template, tokenizer)
CONCURRENCY="${CONCURRENCY:-64}"                       # per shard: the gateway spreads it over its workers
EXTRA="${EXTRA:-}"                                     # anything else for agent.run (e.g. --tools live)
# PYTHON: the interpreter with the toolkit installed (default: python on PATH, e.g. an activated venv)

backend=()
if [[ -n "$GATEWAY" ]]; then
  backend=(--backend sglang --endpoint "$GATEWAY" --model-dir "$MODEL_DIR")
elif [[ -n "${BACKEND:-}" ]]; then
  backend=(--backend "$BACKEND")                       # e.g. scripted (the offline demo; the tests)
fi

# sbatch runs a copy of this script from its spool directory: the repository is where sbatch was called
cd "${REPO:-${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}}"
# shellcheck disable=SC2086 # EXTRA is a list of arguments
exec "${PYTHON:-python}" -m agent.run --method "$METHOD" --benchmark "$BENCHMARK" "${backend[@]}" \
  --trials "$TRIALS" --seed "$SEED" --concurrency "$CONCURRENCY" \
  --shard "$I/$N" --out "$OUT.shard-$I" --no-progress $EXTRA
