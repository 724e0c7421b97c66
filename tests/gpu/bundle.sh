#!/usr/bin/env bash
# Packs the GPU test binaries and benchmark programs built HERE (nvcc compiles sm_90 without a
# GPU) together with the shared libraries they need into .device-carry/, because the GPU machine
# has no package registry to install Debian's -dev packages from. Carry the folder to the GPU
# machine and run `tests/gpu/device.sh` (or `tests/gpu/run.sh FOLDER`) there.
#   LAZYATTN_BUILD_DIR  build folder (default build-gpu)
#   LAZYATTN_CARRY_DIR  output folder (default .device-carry; any /.device-carry* is git-ignored)
#   LAZYATTN_BUNDLE_TARGETS  only these CMake targets (space-separated); programs of other
#                       targets left in the build folder from earlier builds are packed too
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo"
build="${LAZYATTN_BUILD_DIR:-build-gpu}"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAZYATTN_CUDA=ON >/dev/null
# LAZYATTN_BUNDLE_TARGETS (space-separated): build and pack only these targets' programs.
if [ -n "${LAZYATTN_BUNDLE_TARGETS:-}" ]; then
  # shellcheck disable=SC2086
  cmake --build "$build" -j 2 --target $LAZYATTN_BUNDLE_TARGETS
else
  cmake --build "$build" -j 2
fi
carry="$repo/${LAZYATTN_CARRY_DIR:-.device-carry}"
rm -rf "$carry"
mkdir -p "$carry/bin" "$carry/lib"
# GPU tests are the CTest tests labelled "gpu".
mapfile -t gpu_tests < <(ctest --test-dir "$build" -L gpu -N -V 2>/dev/null |
  sed -n 's/^[0-9]*: Test command: \([^ ]*\).*/\1/p' | sort -u)
for bin in "${gpu_tests[@]}" "$build"/bin/* "$build"/tests/quant_linear_cpu_test; do
  [ -x "$bin" ] || continue
  # Only programs that use the GPU, plus the cluster's other two services for the multi-GPU run
  # (tools/cluster-trace); the carry limit is 64 MiB, and the services need gRPC's libraries.
  # The CPU kernel test runs on the GPU machine's CPU, which has SIMD paths this box may lack.
  case "$(basename "$bin")" in
    lazyattn-kvdir | lazyattn-router | lazyattn-bench-engine-overhead | quant_linear_cpu_test) ;;
    # grep without -q reads all of ldd's output: with -q it could exit at the first match, ldd
    # then died of SIGPIPE, and pipefail dropped the program from the bundle now and then.
    *) ldd "$bin" | grep libcudart >/dev/null || continue ;;
  esac
  cp "$bin" "$carry/bin/"
  # Every shared library but those the GPU machine has in newer or identical versions: glibc's,
  # the C++ runtime (Ubuntu 24.04's is newer than Debian 12's) and cuBLAS (541 MB, far over the
  # carry limit; run.sh points at the machine's CUDA install).
  ldd "$bin" | awk '/=> \//{print $3}' |
    grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libstdc\+\+|libgcc_s|libcublas[^/]*)\.so' |
    xargs -r -I{} cp -Lu {} "$carry/lib/"
done
# xz-compressed: the libraries (OpenBLAS, gRPC for the CLI) would not fit the 64 MiB a device
# call carries otherwise. tests/gpu/device.sh and run.sh unpack it.
tar -C "$carry" -cf - bin lib | xz -T2 -6 > "$carry.tar.xz.tmp"
rm -rf "${carry:?}/bin" "${carry:?}/lib"
mv "$carry.tar.xz.tmp" "$carry/bundle.tar.xz"
du -sh "$carry"
