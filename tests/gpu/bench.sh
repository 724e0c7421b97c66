#!/usr/bin/env bash
# Runs on the GPU machine after tests/gpu/run.sh: the attention benchmarks and, in the same call,
# PyTorch SDPA (cuDNN and FlashAttention-2 backends) on the same shapes. Tables and JSON lines go
# to $OUT; copy the tables into docs/benchmarks.md with the command, card and date.
#   tests/gpu/bench.sh [CARRY_DIR (default .device-carry)]
set -uo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo"
carry="${1:-.device-carry}"
out="${OUT:-$repo/$carry/out}"
mkdir -p "$out"
# shellcheck source=tests/gpu/carry_env.sh
source tests/gpu/carry_env.sh
use_carry "$repo" "$carry"
export PYTHONUNBUFFERED=1
date -u +"%F %T UTC" | tee "$out/bench-date.txt"
for bench in decode prefill; do
  program="$carry/bin/lazyattn-bench-$bench"
  [ -x "$program" ] || continue
  echo "=== lazyattn-bench-$bench"
  timeout 240 "$program" 2>&1 | tee "$out/bench-$bench.log" | grep -v '^{'
  echo "=== PyTorch SDPA baseline ($bench)"
  timeout 240 python3 "tools/bench/sdpa_${bench}_baseline.py" 2>&1 | tee "$out/sdpa-$bench.log" |
    grep -v '^{'
done
