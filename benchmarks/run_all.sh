#!/usr/bin/env bash
# Runs every memra benchmark (benchmarks/bench_*.py) on the GPU machine; each prints one JSON
# object per measured shape, teed into $OUT/bench.jsonl (OUT defaults to /tmp/memra-bench);
# each script's stderr (progress, warnings, tracebacks) goes to $OUT/<script>.log.
#   bash benchmarks/run_all.sh [--quick]          (arguments pass through to every script)
# memra: MEMRA_SITE=<dir> uses an importable package there (PYTHONPATH); otherwise it is built
# (incrementally) into build/dev-gpu by scripts/gpu_env.sh's gpu_build.
# fla (the KDA peer): installed from .carry/*.whl with pip --no-deps when not importable.
set -uo pipefail
OUT=${OUT:-/tmp/memra-bench}; mkdir -p "$OUT"
cd "$(dirname "$0")/.."

source scripts/gpu_env.sh
if [ -n "${MEMRA_SITE:-}" ]; then
  site=$MEMRA_SITE
else
  gpu_build
  echo "build: $build_s s -> $site (log $OUT/build.log)" >&2
fi
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
if ! python3 -c "import memra,sys; sys.exit(0 if memra.cuda_available() else 1)"; then
  echo "memra without CUDA here: $(python3 -c 'import memra;print(memra.cuda_unavailable_reason())' 2>&1)" >&2
  tail -20 "$OUT/build.log" 2>/dev/null >&2
  exit 1
fi

if ! python3 -c "import fla.ops.kda" 2>/dev/null; then
  whl=$(ls .carry/fla_core-*.whl .carry/flash_linear_attention-*.whl 2>/dev/null)
  if [ -n "$whl" ]; then
    python3 -m pip install -q --no-deps $whl >"$OUT/pip.log" 2>&1 \
      || echo "pip install of the fla wheels failed (see $OUT/pip.log); the KDA peer will be unavailable" >&2
  else
    echo "fla not importable and no .carry/*.whl: the KDA peer will be unavailable" >&2
  fi
fi

: > "$OUT/bench.jsonl"
status=0
for s in benchmarks/bench_*.py; do
  name=$(basename "$s" .py)
  t0=$(date +%s)
  python3 "$s" "$@" 2>"$OUT/$name.log" | tee -a "$OUT/bench.jsonl"
  rc=${PIPESTATUS[0]}
  echo "$name: rc=$rc, $(( $(date +%s) - t0 )) s" >&2
  if [ "$rc" != 0 ]; then status=1; tail -20 "$OUT/$name.log" >&2; fi
done
echo "$(wc -l < "$OUT/bench.jsonl") JSON lines in $OUT/bench.jsonl" >&2
exit $status
