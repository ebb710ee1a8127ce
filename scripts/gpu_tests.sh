#!/usr/bin/env bash
# On the GPU machine: build memra (scripts/gpu_env.sh) and run the named CUDA test files (all
# of tests/ when none are named), one pytest log per file under $OUT; a summary line per file.
# MEMRA_CMAKE_ARGS: extra CMake arguments for the build (e.g. -DMEMRA_TRACE=ON).
#   bash scripts/gpu_tests.sh [test files...]
set -uo pipefail
OUT=${OUT:-/tmp/memra-out}; mkdir -p "$OUT"
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
gpu_build -DMEMRA_BUILD_TESTS=OFF ${MEMRA_CMAKE_ARGS:-}
echo "build: $build_s s -> $site" | tee -a "$OUT/summary.txt"
[ -n "$site" ] || { tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH="$site"
files=("$@"); [ ${#files[@]} -gt 0 ] || files=(tests)
for f in "${files[@]}"; do
  name=$(basename "$f" .py)
  t1=$(date +%s)
  timeout 300 python3 -m pytest -m cuda --require-cuda -q -rf -s -p no:cacheprovider "$f" > "$OUT/$name.log" 2>&1
  echo "$f: rc=$? $(( $(date +%s) - t1 )) s: $(tail -1 "$OUT/$name.log")" | tee -a "$OUT/summary.txt"
done
