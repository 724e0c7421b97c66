# Sourced by the scripts that run on the GPU machine (run.sh, bench.sh, device.sh):
#   use_carry REPO CARRY_DIR
# unpacks CARRY_DIR/bundle.tar.xz (made by tests/gpu/bundle.sh) once, and puts its libraries and
# the machine's own CUDA libraries (cuBLAS is not carried) on LD_LIBRARY_PATH.
use_carry() {
  local repo="$1" carry="$2"
  if [ -f "$carry/bundle.tar.xz" ] && [ ! -d "$carry/bin" ]; then
    python3 -m tarfile -e "$carry/bundle.tar.xz" "$carry"  # xz may be absent; Python has lzma
  fi
  local cuda_lib
  cuda_lib="$(ls -d /usr/local/cuda*/targets/x86_64-linux/lib 2>/dev/null | head -n 1)"
  export LD_LIBRARY_PATH="$repo/$carry/lib${cuda_lib:+:$cuda_lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}
