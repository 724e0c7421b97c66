#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, after tests/gpu/bundle.sh made the carry
# folder here and the device call carried it: every GPU test binary, logs written to $OUT.
#   tests/gpu/run.sh [CARRY_DIR (default .device-carry)] [gtest filter]
set -uo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo"
carry="${1:-.device-carry}"
filter="${2:-*}"
out="${OUT:-$repo/$carry/out}"
mkdir -p "$out"
if [ -f "$carry/bundle.tar.xz" ] && [ ! -d "$carry/bin" ]; then
  python3 -m tarfile -e "$carry/bundle.tar.xz" "$carry"  # xz may be absent there; Python has lzma
fi
# cuBLAS comes from the machine's own CUDA install (bundle.sh does not carry it).
cuda_lib="$(ls -d /usr/local/cuda*/targets/x86_64-linux/lib 2>/dev/null | head -n 1)"
export LD_LIBRARY_PATH="$repo/$carry/lib${cuda_lib:+:$cuda_lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
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
