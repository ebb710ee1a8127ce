#!/usr/bin/env bash
# On the GPU machine (see ../shared/BUILD.md): build memra there (nvcc + the cuBLAS of the
# machine's torch wheels), run the CUDA tests, the whole suite and compute-sanitizer, logs in $OUT.
#   bash scripts/gpu_run.sh [pytest args for the cuda run]
set -uo pipefail
OUT=${OUT:-/tmp/memra-out}; mkdir -p "$OUT"
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
gpu_build
echo "build: $build_s s -> $site" | tee -a "$OUT/summary.txt"
export PYTHONPATH="$site"
python3 -c "import memra;print('cuda', memra.cuda_available(), memra.cuda_unavailable_reason())" 2>&1 | tee -a "$OUT/summary.txt"
python3 -m pytest -m cuda --require-cuda -q -rf "$@" tests > "$OUT/pytest_cuda.log" 2>&1
echo "pytest -m cuda: rc=$? $(tail -1 "$OUT/pytest_cuda.log")" | tee -a "$OUT/summary.txt"
