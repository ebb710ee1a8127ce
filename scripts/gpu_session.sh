#!/usr/bin/env bash
# On the GPU machine: one device call's worth of work in named phases, each under its own time
# limit and skipped once the call's budget is spent; the logs (one file per phase) come back
# bundled in $OUT/logs.tgz (the device returns few files), a line per phase in $OUT/summary.txt.
#   BUDGET_S=560 bash scripts/gpu_session.sh build tests accuracy model kimi ...
# Phases:
#   build     memra with CUDA into build/dev-gpu (scripts/gpu_env.sh; kept on a warm machine)
#   tracebuild  the same with CMake MEMRA_TRACE=ON (cuda/trace.cu): for trace32 only
#   step32    the B = 32 decode step of the bench model, kernel by kernel: its in-graph trace
#             (trace_model_step.py --batch 32; a tracebuild, else it says so) and ncu of one
#             replayed step (ncu_model_step.py --batch 32: time and DRAM bytes per kernel)
#   ncu32     step32's ncu part alone (any build)
#   tests     the whole CUDA suite (pytest -m cuda, 4 workers) -> pytest_cuda.log
#   tests:F   one test file or node id F (repeatable)
#   short:F   one test node under 60 s; a timeout (a hung kernel) ends the call
#   files:F1,F2,...  those test files together (4 workers) -> files.out
#   accuracy  benchmarks/accuracy_families.py --device cuda -> accuracy_cuda.jsonl
#   model     bench_model_decode --quick --skip-peer, B = 1 and 32 (glm5_next)
#   model32   the same at B = 32 alone (another sample of its rate)
#   ab32      ab_model_replay.py --batch 32: the default arms against mla_tc_mt=2 (32 blocks at
#             B = 32 with the default head tiling; results/2026-12-02-h200-s4.md)
#   qwenself  bench_qwen_decode --quick --skip-peer, both models, B = 1 and 32
#   kimi qwen gdn kdapre mlapre prefill moepre moedec serve
#             the benches of those names (--quick), peers with fla 0.6.0 where carried
#   kdarest   bench_kda_prefill's shapes --quick leaves out (KDA 32 heads, B = 8, T = 32K; GDN B = 8)
#   prefill_long  bench_model_prefill at T = 32K and 128K and 8 prompts of 2K, no peer
#   prefill_mem   bench_model_prefill at T = 1K and 8K and 8 prompts of 2K (both arms), memra only
#   attnpre   bench_attention_prefill --quick (f32 kernel vs tensor-core kernel vs torch SDPA)
#   race_attn racecheck + memcheck over scripts/sanitize_attention_tc.py
#   ncu_dec   ncu over benchmarks/ncu_decode.py: the KDA decode (B = 64, 256) and MLA decode kernels
#   kdadec mladec  bench_kda_decode (fla peer) / bench_mla_decode --variant all, --quick
#   h200only  ends the call at once unless the card is an H200 (put it right after build)
#   mla3      bench_mla_decode --variant default three times, then the MLA decode tests
#   accbench  benchmarks/accuracy_bench_model.py: the 2x rule on the bench model at T = 1K, 8K
#             against transformers f32 (never with fla on the path)
#   tcarms    tests/test_cuda_tc_arms.py (the 2x rule on 300 tokens; which arms ran)
#   ab        B = 1 (and 32) generate, interleaved A/B against the tree of 54e2997 that
#             scripts/make_ab_old.sh put in ./ab_old (built here with gpu_build inside ab_old)
#   mlaab     bench_mla_decode --variant default, this tree and ./ab_old interleaved 4 times each
#             (ab_old from `scripts/make_ab_old.sh REV PATH...`: this tree with the kernel's files
#             of REV), then ab_old's MLA decode tests
#   kdaab     the same for bench_kda_decode (no peer), then this tree's KDA decode tests;
#             KDA_SHAPES=H:B,... in the environment picks the bench's shapes (its --shapes)
# Carried folders it uses when present: .whl_fla (fla wheels), .whl (serve's wheels),
# .triton_cache or .triton_cache.tgz (fla's Triton autotune cache from an earlier call, a folder or
# the tarball a call returns; the updated cache comes back in $OUT/triton_cache.tgz).
set -uo pipefail
OUT0=${OUT:-/tmp/memra-out}; OUT=$OUT0/logs
# A second invocation in the same device call keeps the first's logs (the bundle is re-made).
[ -f "$OUT0/logs.tgz" ] && tar -xzf "$OUT0/logs.tgz" -C "$OUT0"
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
BUDGET_S=${BUDGET_S:-560}
t_start=$(date +%s)
site=$(pwd)/build/dev-gpu/site
export TRITON_CACHE_DIR=/tmp/triton-cache TRITON_CACHE_AUTOTUNING=1  # the peers' autotune results persist too
mkdir -p "$TRITON_CACHE_DIR"
[ -d .triton_cache ] && cp -r .triton_cache/. "$TRITON_CACHE_DIR"/
[ -f .triton_cache.tgz ] && tar -xzf .triton_cache.tgz -C "$TRITON_CACHE_DIR"
peers=""
if ls .whl_fla/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/fla .whl_fla/*.whl \
    >"$OUT/pip_fla.log" 2>&1 && peers=/tmp/fla
fi
left() { echo $(( BUDGET_S - ($(date +%s) - t_start) )); }
# old_build NAME: ./ab_old (scripts/make_ab_old.sh) built with gpu_build inside it -> old_site;
# false, with a line in the summary, when it is missing, the budget is short or the build fails.
old_build() {
  if [ ! -f ab_old/REVISION ]; then
    echo "$1: skipped (no ./ab_old: run scripts/make_ab_old.sh before the call)" | tee -a "$OUT/summary.txt"
    return 1
  fi
  if [ "$(left)" -lt 200 ]; then echo "$1: skipped (budget)" | tee -a "$OUT/summary.txt"; return 1; fi
  local t0; t0=$(date +%s)
  mkdir -p "$OUT/ab_old"
  old_site=$(cd ab_old && OUT=$OUT/ab_old && gpu_build -DMEMRA_BUILD_TESTS=OFF && echo "$site")
  echo "ab_build: $(( $(date +%s) - t0 )) s -> ${old_site:-FAILED} ($(cat ab_old/REVISION))" | tee -a "$OUT/summary.txt"
  [ -n "$old_site" ] || { tail -30 "$OUT/ab_old/build.log"; return 1; }
}
# phase NAME LIMIT_S COMMAND...: runs COMMAND with stdout -> $OUT/NAME.out, stderr -> $OUT/NAME.log
phase() {
  local name=$1 limit=$2; shift 2
  local l; l=$(left)
  if [ "$l" -lt 20 ]; then echo "$name: skipped (budget)" | tee -a "$OUT/summary.txt"; return; fi
  [ "$limit" -gt "$l" ] && limit=$l
  local t0; t0=$(date +%s)
  timeout "$limit" "$@" >"$OUT/$name.out" 2>"$OUT/$name.log"
  echo "$name: rc=$? $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
}
# bench_ab NAME BENCH [ARGS...]: the bench on this tree's build and on old_site, interleaved 4
# times (NAME_new_i, NAME_old_i), then each run's kernel time and fraction of copy per shape.
bench_ab() {
  local name=$1 i f; shift
  for i in 1 2 3 4; do
    phase "${name}_new_$i" 60 env PYTHONPATH="$site" python3 "$@"
    phase "${name}_old_$i" 60 env PYTHONPATH="$old_site" python3 "$@"
  done
  bench_lines "$OUT/${name}"_*.out
}
# bench_lines FILE...: each JSON line's shape, kernel time and fraction of copy, into the summary.
bench_lines() {
  local f
  for f in "$@"; do
    python3 -c "import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    print(sys.argv[1].rsplit('/', 1)[1], r['shape'], r.get('memra_kernel_us'), r.get('kernel_frac_of_copy'))" "$f"
  done | tee -a "$OUT/summary.txt"
}
# cuda_files NAME SITE FILE...: those CUDA test files on SITE's build (4 workers) as phase NAME,
# its last line into the summary.
cuda_files() {
  local name=$1 s=$2; shift 2
  phase "$name" 200 env PYTHONPATH="$s" python3 -m pytest -m cuda --require-cuda -q -rf \
    -p no:cacheprovider -n 4 "$@"
  tail -1 "$OUT/$name.out" | tee -a "$OUT/summary.txt"
}
# The bench model's checkpoint folder (bench_model_decode.py --build-only), as phase NAME.
bench_folder() { phase "$1" 120 env PYTHONPATH="$site" python3 benchmarks/bench_model_decode.py --quick --build-only; }
# ncu of one replayed B = 32 step, kernel by kernel (ncu_model_step.py), as phase NAME.
ncu_step32() {
  phase "$1" 240 env PYTHONPATH="$site" ncu --profile-from-start off --clock-control none --csv \
    --print-units base --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__block_size \
    python3 benchmarks/ncu_model_step.py --batch 32
}
for p in "$@"; do
  case $p in
    build)
      gpu_build -DMEMRA_BUILD_TESTS=OFF
      echo "build: $build_s s -> ${site:-FAILED}" | tee -a "$OUT/summary.txt"
      [ -n "$site" ] || { tail -30 "$OUT/build.log"; exit 1; }
      ;;
    tracebuild)
      gpu_build -DMEMRA_BUILD_TESTS=OFF -DMEMRA_TRACE=ON
      echo "tracebuild: $build_s s -> ${site:-FAILED}" | tee -a "$OUT/summary.txt"
      [ -n "$site" ] || { tail -30 "$OUT/build.log"; exit 1; }
      ;;
    step32)
      bench_folder step32_folder
      phase step32_trace 120 env PYTHONPATH="$site" python3 benchmarks/trace_model_step.py --batch 32
      ncu_step32 step32_ncu
      ;;
    ncu32)
      bench_folder ncu32_folder
      ncu_step32 ncu32
      ;;
    tests)
      phase tests 400 env PYTHONPATH="$site" python3 -m pytest -m cuda --require-cuda -q -rf \
        -p no:cacheprovider -n 4 --durations=15 tests
      tail -3 "$OUT/tests.out" | tee -a "$OUT/summary.txt"
      ;;
    files:*)
      fs=${p#files:}
      phase files 400 env PYTHONPATH="$site" python3 -m pytest -m cuda --require-cuda -q -rf \
        -p no:cacheprovider -n 4 ${fs//,/ }
      tail -3 "$OUT/files.out" | tee -a "$OUT/summary.txt"
      ;;
    short:*)  # one test node under 60 s; a timeout (a hung kernel) ends the call
      f=${p#short:}; n=$(basename "${f%%::*}" .py)
      phase "s_$n" 60 env PYTHONPATH="$site" python3 -m pytest -m cuda --require-cuda -q -rf -s \
        -p no:cacheprovider "$f"
      tail -1 "$OUT/s_$n.out" | tee -a "$OUT/summary.txt"
      grep -q "s_$n: rc=124" "$OUT/summary.txt" && break
      ;;
    tests:*)
      f=${p#tests:}; n=$(basename "${f%%::*}" .py)
      phase "t_$n" 300 env PYTHONPATH="$site" python3 -m pytest -m cuda --require-cuda -q -rf -s \
        -p no:cacheprovider "$f"
      tail -1 "$OUT/t_$n.out" | tee -a "$OUT/summary.txt"
      ;;
    accuracy) phase accuracy 120 env PYTHONPATH="$site" python3 benchmarks/accuracy_families.py --device cuda ;;
    model) phase model 240 env PYTHONPATH="$site${peers:+:$peers}" python3 benchmarks/bench_model_decode.py --quick --skip-peer --batches 1,32 ;;
    ab32)
      bench_folder ab32_folder
      phase ab32 240 env PYTHONPATH="$site" python3 benchmarks/ab_model_replay.py --batch 32 --rounds 10 \
        new mt2:mla_tc_mt=2 ;;
    model32) phase model32 180 env PYTHONPATH="$site" python3 benchmarks/bench_model_decode.py --quick --skip-peer --batches 32 ;;
    kimi) phase kimi 300 env PYTHONPATH="$site${peers:+:$peers}" python3 benchmarks/bench_kimi_decode.py --quick ;;
    qwenself) phase qwenself 200 env PYTHONPATH="$site" python3 benchmarks/bench_qwen_decode.py --quick --skip-peer --model both --batches 1,32 ;;
    qwen) phase qwen 300 env PYTHONPATH="$site${peers:+:$peers}" python3 benchmarks/bench_qwen_decode.py --quick ;;
    gdn) phase gdn 150 env PYTHONPATH="$site${peers:+:$peers}" python3 benchmarks/bench_gdn_decode.py --quick ;;
    kdapre) phase kdapre 240 env PYTHONPATH="$site${peers:+:$peers}" python3 benchmarks/bench_kda_prefill.py --quick ;;
    kdarest) phase kdarest 240 env PYTHONPATH="$site${peers:+:$peers}" python3 benchmarks/bench_kda_prefill.py \
        --quick --kda-shapes 32:1:8192,64:8:2048,64:1:32768 --gdn-shapes 16:32:8:2048 ;;
    prefill_long) phase prefill_long 240 env PYTHONPATH="$site" python3 benchmarks/bench_model_prefill.py \
        --quick --skip-peer --lengths 32768,131072 --batch 8x2048 ;;
    accbench) phase accbench 360 env PYTHONPATH="$site" python3 benchmarks/accuracy_bench_model.py ;;
    tcarms)
      phase tcarms 120 env PYTHONPATH="$site" python3 -m pytest --require-cuda -q -rf -s -p no:cacheprovider \
        tests/test_cuda_tc_arms.py
      tail -1 "$OUT/tcarms.out" | tee -a "$OUT/summary.txt"
      ;;
    ab)
      old_build ab || continue
      phase ab 360 env PYTHONPATH="$site" python3 benchmarks/ab_builds.py --build-folder \
        --build "old=$old_site" --build "new=$site" --batches 1,32 --rounds 16 --steps 128
      grep '"B": 1,' "$OUT/ab.out" | grep -o '"build": "[a-z]*"\|"median_tok_s": [0-9.]*\|"ratio_to_old": [0-9.]*' \
        | paste -sd' ' | sed 's/^/ab B=1: /' | tee -a "$OUT/summary.txt"
      ;;
    h200only)  # ends the call here on any other card (the decode targets are the H200's)
      nvidia-smi --query-gpu=name --format=csv,noheader | tee -a "$OUT/summary.txt" | grep -q H200 || break
      ;;
    mla3)  # the MLA decode target: bench_mla_decode --variant default three times, then its tests
      for i in 1 2 3; do
        phase "mla3_$i" 60 env PYTHONPATH="$site" python3 benchmarks/bench_mla_decode.py --variant default
      done
      bench_lines "$OUT"/mla3_[123].out
      cuda_files mla3_tests "$site" tests/test_cuda_mla_decode.py tests/test_cuda_mla_decode_sm90.py
      ;;
    mlaab)
      old_build mlaab || continue
      bench_ab mlaab benchmarks/bench_mla_decode.py --variant default
      cuda_files mlaab_tests "$old_site" tests/test_cuda_mla_decode.py tests/test_cuda_mla_decode_sm90.py
      ;;
    kdaab)
      old_build kdaab || continue
      bench_ab kdaab benchmarks/bench_kda_decode.py ${KDA_SHAPES:+--shapes "$KDA_SHAPES"}
      cuda_files kdaab_tests "$site" tests/test_cuda_kda_decode.py
      ;;
    kdadec) phase kdadec 150 env PYTHONPATH="$site${peers:+:$peers}" python3 benchmarks/bench_kda_decode.py --quick ;;
    mladec) phase mladec 120 env PYTHONPATH="$site" python3 benchmarks/bench_mla_decode.py --quick --variant all ;;
    prefill_mem) phase prefill_mem 150 env PYTHONPATH="$site" python3 benchmarks/bench_model_prefill.py \
        --quick --skip-peer --lengths 1024,8192 --batch 8x2048 ;;
    attnpre) phase attnpre 150 env PYTHONPATH="$site" python3 benchmarks/bench_attention_prefill.py --quick ;;
    race_attn)
      phase race_attn 150 env PYTHONPATH="$site" compute-sanitizer --tool racecheck --error-exitcode 1 \
        python3 scripts/sanitize_attention_tc.py
      phase mem_attn 150 env PYTHONPATH="$site" compute-sanitizer --tool memcheck --error-exitcode 1 \
        python3 scripts/sanitize_attention_tc.py
      ;;
    ncu_dec) phase ncu_dec 200 env PYTHONPATH="$site" ncu --clock-control none -k regex:"scan_decode|decode_tc|wgmma|mla_combine" -c 21 \
        --section SpeedOfLight --section Occupancy --section LaunchStats python3 benchmarks/ncu_decode.py ;;
    mlapre) phase mlapre 200 env PYTHONPATH="$site${peers:+:$peers}" python3 benchmarks/bench_mla_prefill.py --quick ;;
    prefill) phase prefill 300 env PYTHONPATH="$site${peers:+:$peers}" python3 benchmarks/bench_model_prefill.py --quick ;;
    moepre) phase moepre 200 env PYTHONPATH="$site${peers:+:$peers}" python3 benchmarks/bench_moe_prefill.py --quick ;;
    moedec) phase moedec 150 env PYTHONPATH="$site${peers:+:$peers}" python3 benchmarks/bench_moe_decode.py --quick ;;
    serve)
      if ls .whl/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
          .whl/*.whl >"$OUT/pip_serve.log" 2>&1
      fi
      phase serve 240 env PYTHONPATH="$site:/tmp/site" python3 benchmarks/bench_serve.py --rounds 2
      ;;
    *) echo "unknown phase $p" | tee -a "$OUT/summary.txt" ;;
  esac
done
echo "total: $(( $(date +%s) - t_start )) s" | tee -a "$OUT/summary.txt"
tar -czf "$OUT0/triton_cache.tgz" -C "$TRITON_CACHE_DIR" . 2>/dev/null
tar -czf "$OUT0/logs.tgz" -C "$OUT0" logs && cp "$OUT/summary.txt" "$OUT0/" && rm -rf "$OUT"
