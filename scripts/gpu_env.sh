# Sourced, from the repository root with OUT set, by the scripts that build memra on the GPU
# machine (scripts/gpu_run.sh, scripts/gpu_tests.sh, benchmarks/run_all.sh; see
# ../shared/BUILD.md): puts the CUDA 13 libraries of the machine's nvidia wheels (cuBLAS) on
# LD_LIBRARY_PATH and defines
#   gpu_build [extra cmake args...]
# which builds memra with CUDA, incrementally, into build/dev-gpu (log in $OUT/build.log) and sets
# `site` to the importable package folder (empty when the build failed) and `build_s` to the
# seconds it took.
nvlib=$(python3 -c "import nvidia,os;print(os.path.join(list(nvidia.__path__)[0],'cu13'))" 2>/dev/null || true)
[ -n "$nvlib" ] && export LD_LIBRARY_PATH="$nvlib/lib:${LD_LIBRARY_PATH:-}"

gpu_build() {
  local t0
  t0=$(date +%s)
  site=$(bash scripts/dev_build.sh gpu -DMEMRA_CUDA=ON -DMEMRA_CUBLAS_ROOT="$nvlib" "$@" \
         -DPython_EXECUTABLE="$(command -v python3)" 2>"$OUT/build.log" | tail -1)
  build_s=$(( $(date +%s) - t0 ))
}
