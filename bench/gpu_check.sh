#!/usr/bin/env bash
# The GPU check: proves grpo-stream's GPU paths on a bare GPU machine (no internet, the
# packages of bench/gpu_image.txt) in one call of at most ~8 minutes.
#
#   python scripts/gpu_bundle.py                  # first, on a CPU machine with pip: .whl/
#   bash bench/gpu_check.sh [--cpu] [--model M] [--bundle DIR] [--only STEP,STEP]
#
# Steps (bench/gpu_check.py says what each measures): install (the bundle's wheels into a
# target folder), requirements (grpo_stream comes from that folder; every requirement met),
# nvml (GPU 0's raw NVML record), fingerprint, trainer (fp32 / bf16-mixed / bf16), generate
# (hf engine), publish (device -> pinned host staging), up (a 30-step run on the GPU).
# Everything runs the INSTALLED package: PYTHONPATH is the target folder alone, the steps run
# with `python -P` from a work folder outside the repository.
# --cpu: the same on the CPU with smaller sizes (the rehearsal that tests run here).
# Prints a summary table, then exits 1 if any step failed. Writes gpu_check.json,
# gpu_check.log (each step's log tail) and nvml_record.json (when NVML answered) under $OUT
# when set, else the work folder (GPU_CHECK_WORK, default a new /tmp/gpu-check.*).
# GPU_CHECK_BUDGET (seconds; 480, --cpu 600) bounds the whole run: each step's limit is cut
# to what is left, so the table always comes.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CHECK="$ROOT/bench/gpu_check.py"
CPU=""
MODEL="grpo-stream/tiny-arith"
BUNDLE="$ROOT/.whl"
ONLY=""
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) CPU="--cpu"; shift ;;
    --model) MODEL="$2"; shift 2 ;;
    --bundle) BUNDLE="$2"; shift 2 ;;
    --only) ONLY=",$2,"; shift 2 ;;
    -h | --help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$BUNDLE" in /*) ;; *) BUNDLE="$PWD/$BUNDLE" ;; esac
PY="${PYTHON:-python3}"
WORK="${GPU_CHECK_WORK:-$(mktemp -d /tmp/gpu-check.XXXXXX)}"
BUDGET="${GPU_CHECK_BUDGET:-$([ -n "$CPU" ] && echo 600 || echo 480)}"
# shellcheck source=bench/gpu_steps.sh
. "$ROOT/bench/gpu_steps.sh"

part() { # part NAME: the python side of one step
  "$PY" -P "$CHECK" "$1" $CPU --model "$MODEL" --json-out "$WORK/$1.json" \
    --site "$SITE" --bundle "$BUNDLE" --work "$WORK" --timeout "$((LIMIT - 5))"
}
export -f part
export PY CHECK CPU MODEL WORK SITE BUNDLE

install_bundle
step requirements 60 bash -c 'part requirements'
step nvml 30 bash -c 'part nvml'
step fingerprint 60 bash -c 'part fingerprint'
step trainer 150 bash -c 'part trainer'
step generate 60 bash -c 'part generate'
step publish 60 bash -c 'part publish'
step up 200 bash -c 'part up'

OUT_DIR="${OUT:-$WORK}"
mkdir -p "$OUT_DIR"
"$PY" -P "$CHECK" summary --work "$WORK" --out "$OUT_DIR"
status=$?
write_logs "$OUT_DIR/gpu_check.log"
exit $status
