#!/usr/bin/env bash
# memra's test command (the README's, and what .ci/run calls): installs what the tests need,
# builds memra in editable mode and runs the whole pytest suite (C++ GoogleTest suites included).
# GPU tests (marked cuda) skip with a reason here unless --require-cuda is passed through.
set -euo pipefail
cd "$(dirname "$0")/.."

# GoogleTest headers + libraries for the C++ tests (Debian/Ubuntu). Installed only when missing.
if [ ! -f /usr/include/gtest/gtest.h ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq libgtest-dev cmake ninja-build >/dev/null
  else
    sudo apt-get update -qq && sudo apt-get install -y -qq libgtest-dev cmake ninja-build >/dev/null
  fi
fi

python3 -m pip install -q -e '.[test]'
python3 -m pytest -q "$@"
