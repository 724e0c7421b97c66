#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, after tests/gpu/bundle.sh made the carry
# folder here and the device call carried it: every GPU test binary, logs written to $OUT.
#   tests/gpu/run.sh [CARRY_DIR (default .device-carry)] [gtest filter]
# Tests drawing their inputs from testing::FreshSeed() (kernels/cuda/cuda_test_util.h) print
# the seed on failure; LAZYATTN_TEST_SEED=N replays it.
set -uo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo"
carry="${1:-.device-carry}"
filter="${2:-*}"
out="${OUT:-$repo/$carry/out}"
mkdir -p "$out"
# shellcheck source=tests/gpu/carry_env.sh
source tests/gpu/carry_env.sh
use_carry "$repo" "$carry"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
status=0
for test in "$carry"/bin/*_test; do
  [ -x "$test" ] || continue
  name="$(basename "$test")"
  echo "=== $name"
  if ! "$test" --gtest_color=no --gtest_filter="$filter" 2>&1 | tee "$out/$name.log" | grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED'; then
    status=1
  fi
  grep -q '^\[  FAILED' "$out/$name.log" && status=1
done
exit $status
