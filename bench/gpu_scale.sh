#!/usr/bin/env bash
# grpo-stream at real model shapes on one GPU (Qwen2.5-0.5B, 1.5B and 3B shapes, random bf16
# weights built on the GPU), on a bare machine (no internet, the packages of
# bench/gpu_image.txt) in one call of at most ~9 minutes, from gpu_check.sh's bundle.
#
#   python scripts/gpu_bundle.py                  # first, on a CPU machine with pip: .whl/
#   bash bench/gpu_scale.sh [--cpu] [--bundle DIR] [--only STEP,STEP]
#
# Steps, most wanted first (bench/gpu_scale.py and the modules beside it say what each
# measures): install, requirements, trainer-1.5B and trainer-0.5B (the full GRPO step over
# sequence lengths, layouts and activation checkpointing: tokens/s, MFU, peak memory, the
# restore point), publish (1.5B weights from the trainer's GPU to a generator on the same
# host, in a short run), fsdp (FSDP2 on one NCCL rank against plain training), profile
# (fp32 / bf16-mixed / bf16 on gpu_check's step, with each one's top operators),
# generate-0.5B and generate-1.5B (hf engine, batch 64-256, against the bandwidth bound),
# up (20 steps of `grpo-stream up` at 0.5B, every service on the GPU), trainer-3B.
# --cpu: the same on the CPU with the tiny shape (the rehearsal that tests run here).
# Prints a summary table, then exits 1 if any step failed. Writes gpu_scale.json and
# gpu_scale.log under $OUT when set, else the work folder (GPU_SCALE_WORK, default a new
# /tmp/gpu-scale.*). GPU_SCALE_BUDGET (seconds; 540, --cpu 900) bounds the whole run: each
# step's limit is cut to what is left, so the table always comes.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SCALE="$ROOT/bench/gpu_scale.py"
CPU=""
BUNDLE="$ROOT/.whl"
ONLY=""
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) CPU="--cpu"; shift ;;
    --bundle) BUNDLE="$2"; shift 2 ;;
    --only) ONLY=",$2,"; shift 2 ;;
    -h | --help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "gpu_scale.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$BUNDLE" in /*) ;; *) BUNDLE="$PWD/$BUNDLE" ;; esac
PY="${PYTHON:-python3}"
WORK="${GPU_SCALE_WORK:-$(mktemp -d /tmp/gpu-scale.XXXXXX)}"
BUDGET="${GPU_SCALE_BUDGET:-$([ -n "$CPU" ] && echo 900 || echo 540)}"
STEP_SCALE="$([ -n "$CPU" ] && echo 3 || echo 1)"  # the CPU rehearsal: limits x3, budget 900 s
# shellcheck source=bench/gpu_steps.sh
. "$ROOT/bench/gpu_steps.sh"

part() { # part NAME [ARGS]: the python side of one step (its JSON: WORK/STEP.json)
  local name=$1
  shift
  "$PY" -P "$SCALE" "$name" $CPU "$@" --json-out "$WORK/$STEP.json" --site "$SITE" \
    --bundle "$BUNDLE" --work "$WORK" --timeout "$((LIMIT - 10))" \
    ${CPU:+--peak-tflops 0.2 --hbm-gbps 20}
}
export -f part
export PY SCALE CPU WORK SITE BUNDLE

install_bundle
step requirements 40 bash -c 'part requirements'
step trainer-1.5B 90 bash -c 'part trainer --shape 1.5B --max-cells 4'
step trainer-0.5B 50 bash -c 'part trainer --shape 0.5B'
step publish 60 bash -c 'part publish --shape 1.5B'
step fsdp 45 bash -c 'part fsdp --shape 0.5B --seqs 4096'
step profile 35 bash -c 'part profile'
step generate-0.5B 25 bash -c 'part generate --shape 0.5B'
step generate-1.5B 25 bash -c 'part generate --shape 1.5B'
step up 80 bash -c 'part up --shape 0.5B'
step trainer-3B 50 bash -c 'part trainer --shape 3B --seqs 4096 --max-cells 2'

OUT_DIR="${OUT:-$WORK}"
mkdir -p "$OUT_DIR"
"$PY" -P "$SCALE" summary --work "$WORK" --out "$OUT_DIR"
status=$?
write_logs "$OUT_DIR/gpu_scale.log"
exit $status
