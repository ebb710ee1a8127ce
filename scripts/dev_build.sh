#!/usr/bin/env bash
# Developer build without pip: builds the extension and the C++ tests into build/dev-NAME and
# lays out an importable package at build/dev-NAME/site (use as PYTHONPATH).
#   scripts/dev_build.sh NAME [extra cmake args]
set -euo pipefail
name=${1:-default}; shift || true
root=$(cd "$(dirname "$0")/.." && pwd)
b="$root/build/dev-$name"
cmake -S "$root" -B "$b" -G Ninja -DMEMRA_CUDA=OFF -DMEMRA_BUILD_TESTS=ON \
  -DPython_EXECUTABLE="$(command -v python3)" "$@" >/dev/null
ninja -C "$b" >&2
rm -rf "$b/site" && mkdir -p "$b/site"
cp -r "$root/python/memra" "$b/site/memra"
cp "$b"/_core*.so "$b/site/memra/"
cp "$b"/libmemra_cuda.so "$b/site/memra/" 2>/dev/null || true
prebuilt=$(grep -o "MEMRA_CUDA_PREBUILT:FILEPATH=.*" "$b/CMakeCache.txt" | cut -d= -f2 || true)
if [ -n "$prebuilt" ]; then cp "$prebuilt" "$b/site/memra/"; fi
echo "$b/site"
