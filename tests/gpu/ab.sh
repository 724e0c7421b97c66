#!/usr/bin/env bash
# A/B of whole engine steps on the GPU machine: lazyattn-bench-engine with flags A, then B, then
# A, then B... in one call, so both sides see the same machine (machines differ by ~2 % on the
# same code, more than most changes gain). Kernel timings alone can mislead: the wgmma GEMM lost
# to cuBLASLt timed alone and won inside graph-replayed steps (docs/kernels.md, "Small kernels").
#   tests/gpu/ab.sh [CARRY_DIR (default .device-carry)]
# Environment: LAZYATTN_AB_A, LAZYATTN_AB_B (extra flags of each side; default empty),
# LAZYATTN_AB_PARTS (default "--parts decode --batches 32"), LAZYATTN_AB_ROUNDS (default 2),
# LAZYATTN_AB_BIN_A, LAZYATTN_AB_BIN_B (each side's lazyattn-bench-engine, default the carried
# one: another build's binary, e.g. the commit before a kernel change, runs with the carry's
# libraries).
# Prints each run's table rows (decode: batch, context, step ms, tokens/s, GPU ms, ...; ttft: mode,
# cold, 3 of 5, all cached ms, ...) prefixed by its side and round; logs go to $OUT.
set -uo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo" || exit 1
carry="${1:-.device-carry}"
out="${OUT:-$repo/$carry/out}"
mkdir -p "$out"
# shellcheck source=tests/gpu/carry_env.sh
source tests/gpu/carry_env.sh
use_carry "$repo" "$carry"
parts="${LAZYATTN_AB_PARTS:---parts decode --batches 32}"
rounds="${LAZYATTN_AB_ROUNDS:-2}"
status=0
date -u +"%F %T UTC"
echo "A: ${LAZYATTN_AB_A:-(none)}"
echo "B: ${LAZYATTN_AB_B:-(none)}"
echo "binaries: ${LAZYATTN_AB_BIN_A:-carried} / ${LAZYATTN_AB_BIN_B:-carried}"
for round in $(seq 1 "$rounds"); do
  for side in A B; do
    flags="LAZYATTN_AB_$side"
    bin_var="LAZYATTN_AB_BIN_$side"
    bin="${!bin_var:-$carry/bin/lazyattn-bench-engine}"  # relative: from the repository root
    [ -x "$bin" ] || { echo "$bin_var: $bin is not an executable" >&2; exit 2; }
    log="$out/ab-$side-$round.log"
    # shellcheck disable=SC2086
    timeout "${LAZYATTN_ENGINE_TIMEOUT:-420}" "$bin" $parts \
      ${!flags:-} > "$log" 2>&1 || status=1
    # Table rows only (not headers, separators or JSON), tagged with the run.
    grep -E '^\| ' "$log" | grep -v -E '^\| (batch|mode|rows|---)' | sed "s/^/$side$round /"
  done
done
exit $status
