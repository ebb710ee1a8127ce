#!/usr/bin/env bash
# The "before" tree of issue 20's B = 1 generate A/B (scripts/gpu_session.sh phase ab): the source
# of commit REV (default 54e2997, main just before the issue-20 work merged) extracted into
# ./ab_old of this checkout, without its tests/ (the A/B needs the library only, and nothing under
# ab_old is then a test pytest could collect). scripts/dev_build.sh is replaced by this checkout's
# (the old one exits non-zero when CMake defines no MEMRA_CUDA_PREBUILT, i.e. without CUDA; the
# build script is no part of what the A/B measures).
# ab_old is left untracked and NOT ignored, so the device copy of the working tree carries it
# (its build/ stays ignored, so a warm machine keeps the old build); never commit it.
# With PATHs after REV, ab_old is instead HEAD's source with only those paths as they were at REV
# (one kernel's A/B against its predecessor, everything else equal; phase mlaab):
#   scripts/make_ab_old.sh [REV [PATH...]]
#   scripts/make_ab_old.sh '73f01c3^' cuda/mla_decode_sm90.cu cuda/mla_decode_sm90.cuh cuda/mla_sm90.cuh
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:-54e2997}
[ $# -gt 0 ] && shift
rm -rf ab_old && mkdir ab_old
if [ $# -gt 0 ]; then
  git archive --format=tar HEAD | tar -x -C ab_old --exclude=tests
  for f in "$@"; do git show "$rev:$f" > "ab_old/$f"; done
  echo "HEAD $(git rev-parse HEAD) with $* from $(git rev-parse "$rev^{commit}")" > ab_old/REVISION
else
  git archive --format=tar "$rev" | tar -x -C ab_old --exclude=tests
  git rev-parse "$rev^{commit}" > ab_old/REVISION
fi
cp scripts/dev_build.sh ab_old/scripts/dev_build.sh
echo "ab_old: $(cat ab_old/REVISION) ($(du -sh ab_old | cut -f1))"
