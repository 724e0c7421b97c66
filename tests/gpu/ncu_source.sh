#!/usr/bin/env bash
# Per-instruction stall samples (Nsight Compute's SourceCounters) of the kept prefill kernel and
# of the few-row wgmma products inside the all-cached TTFT step (64 rows) and a batch-32 decode
# step (32 rows), packed into $OUT/ncu-source.tgz: .ncu-rep reports, the details pages, and the
# source pages as CSV (every SASS instruction with its samples and stall reasons), for reading
# where a kernel's warps wait (docs/kernels.md; tests/gpu/ncu_stalls.py sums them). Run on the
# GPU machine after tests/gpu/carry_env.sh's use_carry unpacked the bundle into CARRY.
# Part peer: the same sections for PyTorch SDPA's cuDNN kernel on the prefill shapes (its launch
# shape, registers, pipes and stalls beside ours; no source page, cuDNN ships no SASS names).
#   ncu_source.sh CARRY [prefill] [products] [peer]
set -uo pipefail
carry="$1"
shift
parts="${*:-prefill products peer}"
final_out="$OUT"
OUT="$(mktemp -d)"
status=0
# A profile that did not come out is reported and fails the script; the others still run.
failed() {
  echo "ncu_source.sh: $1 failed (its log is in ncu-source.tgz)" >&2
  status=1
}
ncu_bin="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda*/bin/ncu 2>/dev/null | head -n 1)"
sections=(--section SpeedOfLight --section WarpStateStats --section SchedulerStats
  --section SourceCounters --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis
  --section LaunchStats --section Occupancy --import-source no)
export_source() {  # report -> CSV of SASS with per-instruction samples
  # ncu exits 0 when its kernel filter matched nothing, and then writes no report.
  [ -f "$1.ncu-rep" ] || { failed "$(basename "$1") (no kernel profiled)"; return; }
  "$ncu_bin" -i "$1.ncu-rep" --page source --csv --print-source sass >"$1-sass.csv" 2>&1 ||
    "$ncu_bin" -i "$1.ncu-rep" --page source --csv >"$1-sass.csv" 2>&1
  "$ncu_bin" -i "$1.ncu-rep" --page details >"$1-details.txt" 2>&1
}
for part in $parts; do
  case "$part" in
    prefill)
      for shape in q512 q4096; do
        timeout 240 "$ncu_bin" --clock-control none -k regex:PagedPrefillWgmmaWs --launch-skip 1 \
          --launch-count 1 "${sections[@]}" -f -o "$OUT/prefill-$shape" \
          "$carry/bin/lazyattn-bench-prefill" --only="$shape" --variant=rotate-q \
          --kernel=wgmma-ws/pp-s5 --reps=2 --warmup=1 >"$OUT/prefill-$shape.log" 2>&1 ||
          failed "prefill $shape"
        export_source "$OUT/prefill-$shape"
      done
      ;;
    peer)
      for shape in q512 q4096; do
        # Launches: the backend check, one warm-up, then the timed ones; the fourth is profiled.
        timeout 240 "$ncu_bin" --clock-control none -k "regex:sdpa|fprop|fmha|flash" \
          --launch-skip 3 --launch-count 1 "${sections[@]}" -f -o "$OUT/peer-$shape" \
          python3 tools/bench/sdpa_prefill_baseline.py --only="$shape" --backends=cudnn --reps=2 \
          --warmup=1 >"$OUT/peer-$shape.log" 2>&1 || failed "peer $shape"
        [ -f "$OUT/peer-$shape.ncu-rep" ] || { failed "peer $shape (no kernel profiled)"; continue; }
        "$ncu_bin" -i "$OUT/peer-$shape.ncu-rep" --page details >"$OUT/peer-$shape-details.txt" 2>&1
      done
      ;;
    products)
      # Layer 1's four products (qkv, o, gate/up, down) of the profiled step.
      timeout 300 "$ncu_bin" --profile-from-start off --clock-control none -k regex:SkinnyWgmma \
        --launch-skip 4 --launch-count 4 "${sections[@]}" -f -o "$OUT/products-64" \
        "$carry/bin/lazyattn-bench-engine" --parts ttft --ttft-modes lazy --profile-ttft-step \
        >"$OUT/products-64.log" 2>&1 || failed "products at 64 rows"
      export_source "$OUT/products-64"
      timeout 300 "$ncu_bin" --profile-from-start off --clock-control none -k regex:SkinnyWgmma \
        --launch-skip 4 --launch-count 4 "${sections[@]}" -f -o "$OUT/products-32" \
        "$carry/bin/lazyattn-bench-engine" --parts decode --batches 32 --profile-decode-steps 1 \
        >"$OUT/products-32.log" 2>&1 || failed "products at 32 rows"
      export_source "$OUT/products-32"
      ;;
    *)
      echo "ncu_source.sh: unknown part '$part' (prefill, products, peer)" >&2
      status=2
      ;;
  esac
done
tar -C "$OUT" -czf "$final_out/ncu-source.tgz" . || status=1
exit "$status"
