#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, after tests/gpu/bundle.sh made .device-carry/
# here and the device call carried it: every GPU test binary, with its log written to $OUT.
set -uo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo"
out="${OUT:-$repo/.device-carry/out}"
mkdir -p "$out"
export LD_LIBRARY_PATH="$repo/.device-carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
status=0
for test in .device-carry/bin/*_test; do
  [ -x "$test" ] || continue
  name="$(basename "$test")"
  echo "=== $name"
  if ! "$test" --gtest_color=no 2>&1 | tee "$out/$name.log" | grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED'; then
    status=1
  fi
  grep -q '^\[  FAILED' "$out/$name.log" && status=1
done
exit $status
