#!/usr/bin/env bash
# On the GPU machine: issue 17's "bytes unchanged, no slowdown" checks of this tree against the
# build before the house work (a source tree carried as .carry/baseline-src, copied to /tmp, made on the dev machine with
#   mkdir -p .carry/baseline-src && git archive house-baseline | tar -x -C .carry/baseline-src
# and carried). Steps (any subset, in this order): build, folder, bytes, tests, ab.
#   build:  both trees built with CUDA (in parallel; new -> build/dev-gpu, old -> $OLD_SRC/build/dev-gpu)
#   folder: the 8-layer bench checkpoint (benchmarks/bench_model_decode.py --build-only)
#   bytes:  scripts/house_bytes.py snapshots with both builds -- CUDA f32 and bf16 on the tiny
#           fixtures and the bench model, CPU f32 on the tiny fixtures and the bench model (the CPU
#           ones in the background) -- then --compare of each pair -> $OUT/bytes.jsonl
#   tests:  the CUDA suite of the new build -> $OUT/pytest_cuda.log
#   ab:     benchmarks/ab_builds.py old vs new at B = 1 and 32 -> $OUT/ab_builds.jsonl
#   bash scripts/house_gpu_check.sh build folder bytes tests ab
set -uo pipefail
OUT=${OUT:-/tmp/memra-out}; mkdir -p "$OUT"
cd "$(dirname "$0")/.."
root=$(pwd)
# The old tree is built outside the repository: a carried folder is replaced on every call.
OLD_SRC=/tmp/memra-old-src
[ -d "$OLD_SRC" ] || cp -r "${OLD_SRC_IN:-.carry/baseline-src}" "$OLD_SRC"
SNAP=${SNAP:-/tmp/memra-house}; mkdir -p "$SNAP"
FOLDER=${FOLDER:-/tmp/memra-bench-glm5next-8L32E}
source scripts/gpu_env.sh
new_site=$root/build/dev-gpu/site
old_site=$OLD_SRC/build/dev-gpu/site
tiny="python/memra/data/tiny_glm5_next tests/fixtures/tiny_glm5_next_bf16"
has() { [[ " $* " == *" $step "* ]]; }
for step in "$@"; do
  t0=$(date +%s)
  case $step in
    build)
      (cd "$OLD_SRC" && bash scripts/dev_build.sh gpu -DMEMRA_CUDA=ON -DMEMRA_CUBLAS_ROOT="$nvlib" \
         -DMEMRA_BUILD_TESTS=OFF -DPython_EXECUTABLE="$(command -v python3)" >/dev/null 2>"$OUT/build_old.log") &
      gpu_build -DMEMRA_BUILD_TESTS=OFF
      wait
      ls "$new_site/memra/libmemra_cuda.so" "$old_site/memra/libmemra_cuda.so" >/dev/null || { tail -20 "$OUT/build.log" "$OUT/build_old.log"; exit 1; }
      ;;
    folder)
      PYTHONPATH=$new_site python3 benchmarks/bench_model_decode.py --build-only --folder "$FOLDER" > "$OUT/folder.log" 2>&1
      ;;
    bytes)
      bench=""; [ -f "$FOLDER/config.json" ] && bench=$FOLDER
      for b in old new; do
        site=$old_site; [ $b = new ] && site=$new_site
        PYTHONPATH=$site nohup python3 scripts/house_bytes.py --device cpu --prompt-len 8 \
          --out "$SNAP/cpu_$b.npz" $tiny $bench > "$SNAP/cpu_$b.log" 2>&1 &
        for dt in float32 bfloat16; do
          PYTHONPATH=$site python3 scripts/house_bytes.py --device cuda --dtype $dt \
            --out "$SNAP/cuda_${dt}_$b.npz" $tiny $bench > "$SNAP/cuda_${dt}_$b.log" 2>&1 || echo "cuda $dt $b failed"
        done
      done
      for dt in float32 bfloat16; do
        python3 scripts/house_bytes.py --compare "$SNAP/cuda_${dt}_old.npz" "$SNAP/cuda_${dt}_new.npz" >> "$OUT/bytes.jsonl"
      done
      ;;
    cpubytes)  # after `bytes`: waits for the background CPU snapshots
      while pgrep -f "house_bytes.py --device cpu" >/dev/null; do sleep 5; done
      python3 scripts/house_bytes.py --compare "$SNAP/cpu_old.npz" "$SNAP/cpu_new.npz" >> "$OUT/bytes.jsonl"
      ;;
    tests)
      PYTHONPATH=$new_site timeout 420 python3 -m pytest -m cuda --require-cuda -q -rf -p no:cacheprovider tests \
        > "$OUT/pytest_cuda.log" 2>&1
      echo "pytest -m cuda: rc=$? $(tail -1 "$OUT/pytest_cuda.log")"
      ;;
    ab)
      python3 benchmarks/ab_builds.py --build old="$old_site" --build new="$new_site" --folder "$FOLDER" \
        --batches 1,32 --rounds ${ROUNDS:-6} > "$OUT/ab_builds.jsonl" 2> "$OUT/ab_builds.log"
      cat "$OUT/ab_builds.jsonl" | cut -c1-220
      ;;
  esac
  echo "$step: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
done
grep -h '"array_equal": false' "$OUT/bytes.jsonl" 2>/dev/null | head
echo "bytes: $(grep -c '"array_equal": true' "$OUT/bytes.jsonl" 2>/dev/null) equal, $(grep -c '"array_equal": false' "$OUT/bytes.jsonl" 2>/dev/null) differ"
