#!/usr/bin/env bash
# The fuzz stage: builds the libFuzzer targets (clang, ASan + UBSan, CPU only, in build-fuzz/) and
# runs each fuzz_<name> for a bounded time, starting from its committed seed corpus and regression
# inputs. New inputs go to a scratch copy of the corpus under the build folder; the committed corpus
# is never modified. Fails, naming the crashing input, when a target crashes, hangs or leaks.
#
#   tests/fuzz/run.sh                  every target, LAZYATTN_FUZZ_BUDGET_S seconds in all
#   tests/fuzz/run.sh engine kvdir_events   only these targets
#   --no-build                         use the fuzz build folder as it is
#
# Environment: LAZYATTN_FUZZ_BUILD (build folder, default build-fuzz), LAZYATTN_FUZZ_SECONDS (per
# target; default: the budget shared out), LAZYATTN_FUZZ_BUDGET_S (default 420: with the build
# warm the stage fits ~8 minutes on 2 cores), LAZYATTN_JOBS (targets run at once, default nproc).
# docs/testing.md says how to add a target and how to keep a crash as a regression input.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo"
build="${LAZYATTN_FUZZ_BUILD:-build-fuzz}"
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$repo}"
# -g builds hash their folder unless told not to; clones in other folders then share the cache.
export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
jobs="${LAZYATTN_JOBS:-$(nproc)}"
budget="${LAZYATTN_FUZZ_BUDGET_S:-420}"

do_build=1
names=()
for arg in "$@"; do
  case "$arg" in
    --no-build) do_build=0 ;;
    -*) echo "run.sh: unknown option $arg" >&2; exit 2 ;;
    *) names+=("$arg") ;;
  esac
done

if [ "$do_build" -eq 1 ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g" \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DLAZYATTN_CUDA=OFF -DLAZYATTN_FUZZ=ON >/dev/null
fi
if [ ${#names[@]} -eq 0 ]; then
  mapfile -t names < <(ninja -C "$build" -t targets all |
    sed -n 's/^fuzz_\([A-Za-z0-9_]*\): phony$/\1/p' | grep -v '_replay$' | sort -u)
fi
if [ ${#names[@]} -eq 0 ]; then
  echo "run.sh: no fuzz targets in $build (is it configured with -DLAZYATTN_FUZZ=ON?)" >&2
  exit 1
fi
if [ "$do_build" -eq 1 ]; then
  start=$SECONDS
  cmake --build "$build" -j "$jobs" --target "${names[@]/#/fuzz_}"
  echo "run.sh: built ${#names[@]} fuzz targets in $((SECONDS - start)) s"
fi

rounds=$(( (${#names[@]} + jobs - 1) / jobs ))
seconds="${LAZYATTN_FUZZ_SECONDS:-$(( budget / rounds ))}"
[ "$seconds" -ge 1 ] || seconds=1
out="$build/fuzz-runs/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$out"
echo "run.sh: ${#names[@]} targets, ${seconds} s each, ${jobs} at a time; logs in $out"

# Any sanitizer report is a crash: libFuzzer then writes the input to the artifact prefix.
export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"

fuzz_one() {
  local name="$1" dir="$out/$1"
  mkdir -p "$dir/corpus" "$dir/artifacts"
  for src in "tests/fuzz/corpus/$name" "tests/fuzz/regressions/$name"; do
    if [ -d "$src" ]; then find "$src" -type f -exec cp -t "$dir/corpus" {} +; fi
  done
  # -timeout: one input running this long is a hang (targets keep each input well under 100 ms).
  "$build/fuzz/fuzz_$name" "$dir/corpus" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=2048 -max_len=4096 -print_final_stats=1 \
    -artifact_prefix="$dir/artifacts/" >"$dir/log" 2>&1
}

failed=()
declare -A pid_of=()
report() {  # name, exit status
  local name="$1" rc="$2" dir="$out/$1"
  local stats
  stats="$(grep -E '^stat::(number_of_executed_units|new_units_added)' "$dir/log" 2>/dev/null |
    sed 's/^stat:://; s/  */ /g' | tr '\n' ' ')"
  if [ "$rc" -eq 0 ]; then
    echo "run.sh: fuzz_$name ok: $stats"
    return
  fi
  failed+=("$name")
  echo "run.sh: fuzz_$name FAILED (exit $rc); the end of its log ($dir/log):"
  tail -n 40 "$dir/log" | sed 's/^/    /'
  local artifact
  for artifact in "$dir"/artifacts/*; do
    [ -e "$artifact" ] || continue
    echo "run.sh: crashing input: $artifact"
    echo "  reproduce: $build/fuzz/fuzz_$name $artifact"
    echo "  keep it as a regression input (runs in ctest as fuzz_${name}_replay):"
    echo "    cp $artifact tests/fuzz/regressions/$name/<what-it-breaks>"
  done
}

for name in "${names[@]}"; do
  if [ ! -x "$build/fuzz/fuzz_$name" ]; then
    echo "run.sh: $build/fuzz/fuzz_$name is missing" >&2
    failed+=("$name")
    continue
  fi
  while [ "${#pid_of[@]}" -ge "$jobs" ]; do
    rc=0; wait -n -p done_pid || rc=$?
    for n in "${!pid_of[@]}"; do
      if [ "${pid_of[$n]}" = "$done_pid" ]; then unset "pid_of[$n]"; report "$n" "$rc"; fi
    done
  done
  fuzz_one "$name" &
  pid_of[$name]=$!
done
while [ "${#pid_of[@]}" -gt 0 ]; do
  rc=0; wait -n -p done_pid || rc=$?
  for n in "${!pid_of[@]}"; do
    if [ "${pid_of[$n]}" = "$done_pid" ]; then unset "pid_of[$n]"; report "$n" "$rc"; fi
  done
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "run.sh: FAILED: ${failed[*]}"
  exit 1
fi
echo "run.sh: all ${#names[@]} fuzz targets ran ${seconds} s without a crash"
