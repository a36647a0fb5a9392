#!/usr/bin/env bash
# The device check of the Triton engine (see benchmarks/gpu_check.py): speed first, then
# registers, correctness and determinism, results written after every step. It stops
# starting new work after 420 s and is killed at 470 s: under 8 minutes, cold compiles included.
# Usage: benchmarks/gpu_check.sh [OUT_DIR]   (PYTHON picks the interpreter; default .venv's, else python3)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
OUT_DIR="${1:-${OUT:-out/gpu}}"
export PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
exec timeout 470 "$PYTHON" benchmarks/gpu_check.py --out "$OUT_DIR" --budget 420
