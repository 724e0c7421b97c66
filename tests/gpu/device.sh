#!/usr/bin/env bash
# Everything the GPU machine runs, in one command (after tests/gpu/bundle.sh packed the carry
# folder here and the device call carried it):
#   tests/gpu/device.sh [PARTS]  PARTS: comma list of tests,cli,hf,bench,engine,hfbase (the
#   default), cluster, ncu, ncuprefill and ncusource (only when named)
#   tests  every GPU test binary (tests/gpu/run.sh)
#   cli    `lazyattn generate` on SmolLM2 with --backend cuda and cpu, and `lazyattn replay` on
#          both (tests/integration/replay_check.py: same document hits), when the model came along
#   hf     our logits against HF transformers on random Llama models (tests/gpu/hf_logits_check.py)
#          and, when SmolLM2 and the gguf wheel (.whl/, tests/gpu/fetch-wheels.sh) came along,
#          on the real SmolLM2 GGUF's golden prompts (tests/gpu/hf_gguf_check.py)
#   bench  the attention kernel benchmarks against PyTorch SDPA (tests/gpu/bench.sh)
#   engine the CUDA backend end to end on llama3-8b random weights (lazyattn-bench-engine)
#   hfbase HF transformers on the same shapes (tools/bench/hf_rag_baseline.py)
#   ab     whole steps with two sets of bench flags, alternated in one call (tests/gpu/ab.sh;
#          LAZYATTN_AB_A, LAZYATTN_AB_B, LAZYATTN_AB_PARTS, LAZYATTN_AB_ROUNDS); only when named
#   cluster tools/cluster-trace on this machine: kvdir, the router and one CUDA worker per GPU
#          serving random:llama3-8b (issue 7's run; LAZYATTN_CLUSTER_ARGS adds flags)
#   clustertests the integration scenarios that attack workers (reproducer, soak on two models,
#          fault, resilience) against CUDA workers (tests/gpu/cluster_tests.sh;
#          LAZYATTN_CLUSTER_TESTS picks scenarios); only when named
#   replay `lazyattn replay` on random llama3-8b, 32 x (2K document, 256 tokens), greedy against
#          T 0.8 top-p 0.95 (tests/gpu/sampled_replay.sh); only when named
#   sanitize compute-sanitizer memcheck and racecheck on the sampling kernel tests
#          (LAZYATTN_SANITIZE_BIN, default kernels_cuda_ops_test; LAZYATTN_SANITIZE_FILTER,
#          default SampleRowsCudaTest.*:-*Draws*); only when named
#   cpu    the CPU kernel tests (quant_linear_cpu_test) on this machine's CPU, whose SIMD
#          extensions (AVX-512, VNNI) the development box may lack; only when named
#   overhead the router's costs on this machine's idle CPUs: TLS + API keys against plaintext,
#          HTTP against gRPC (tests/gpu/overhead.sh; LAZYATTN_OVERHEAD_ROUNDS); only when named
#   ncu    every kernel's duration inside 2 steady decode steps (batch 1 at 20K, batch 32 at 2K),
#          from Nsight Compute with the clocks and caches left alone; summed per kernel name
#          (LAZYATTN_NCU_ARGS="--parts ttft --profile-ttft-step": the all-cached TTFT step instead)
#   ncuprefill Nsight Compute's sections for the kept prefill kernel at q512 and q4096
#          (LAZYATTN_NCU_PREFILL_KERNEL, default wgmma-ws/pp-s5); only when named
#   ncusource per-instruction stall samples (SourceCounters) of the prefill kernel at q512 and
#          q4096 and of the few-row products in the all-cached TTFT step and a batch-32 decode
#          step, and the same sections for SDPA's cuDNN kernel at q512 and q4096, as reports and
#          SASS CSV in $OUT/ncu-source.tgz (tests/gpu/ncu_source.sh; LAZYATTN_NCU_SOURCE_PARTS,
#          default "prefill products peer"); only when named
# Logs go to a scratch folder and come back as one archive, $OUT/gpu-logs.tgz, plus a summary.
# Environment: LAZYATTN_CARRY (default .device-carry), LAZYATTN_ENGINE_ARGS (extra bench flags),
# LAZYATTN_ENGINE_TIMEOUT (seconds, default 420), LAZYATTN_NCU_ARGS (the bench flags ncu runs,
# default "--parts decode --batches 32"). Every step has a time limit so the logs always
# come back.
set -uo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo"
parts="${1:-tests,cli,hf,bench,engine,hfbase}"
carry="${LAZYATTN_CARRY:-.device-carry}"
final_out="${OUT:-$repo/$carry/out}"
logs="$(mktemp -d)"
export OUT="$logs" PYTHONUNBUFFERED=1
# shellcheck source=tests/gpu/carry_env.sh
source tests/gpu/carry_env.sh
use_carry "$repo" "$carry"
# SmolLM2 (98 MB) is larger than one call may carry: tests/gpu/split-model.sh cuts it into
# .device-carry-model-a/, -b/ and -c/, carried by three calls in a row (each while the machine is
# still warm; the last with the bundle). Only a complete, checksum-verified file is used;
# otherwise its tests skip.
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$model" ] && compgen -G ".device-carry-model-*/part-*" >/dev/null; then
  mkdir -p models && cat .device-carry-model-*/part-* > "$model.tmp"
  want="$(python3 -c 'import json; print(json.load(open("tests/data/generation_golden.json"))["model_sha256"])')"
  if [ "$(sha256sum "$model.tmp" | cut -d" " -f1)" = "$want" ]; then
    mv "$model.tmp" "$model"
  else
    echo "SmolLM2 parts incomplete (the machine was not warm for both calls): its tests skip"
    rm -f "$model.tmp"
  fi
fi
status=0
has() { [[ ",$parts," == *",$1,"* ]]; }
# Carried wheels (the machine cannot download): installed beside the image's packages.
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
date -u +"%F %T UTC" | tee "$logs/date.txt"
if has tests; then timeout 300 tests/gpu/run.sh "$carry" || status=1; fi
if has cli && [ -f "$model" ]; then
  echo "=== lazyattn generate --backend cuda (SmolLM2, 2 documents)"
  printf 'The Amstel river flows through Amsterdam and gave the city its name.\n' > /tmp/doc1.txt
  printf 'Amsterdam has more than 1,500 bridges over its canals.\n' > /tmp/doc2.txt
  for backend in cuda cpu; do
    timeout 120 "$carry/bin/lazyattn" generate --model "$model" --backend "$backend" --chat \
      --doc /tmp/doc1.txt --doc /tmp/doc2.txt --prompt "Which river gave Amsterdam its name?" \
      --max-tokens 40 --json 2>&1 | tee "$logs/generate-$backend.log" || status=1
  done
  echo "=== lazyattn replay --backend cuda beside cpu (SmolLM2, 4 requests over 3 documents)"
  timeout 300 python3 tests/integration/replay_check.py --lazyattn "$carry/bin/lazyattn" --model "$model" \
    --workdir /tmp/replay-check 2>&1 | tee "$logs/replay.log" || status=1
fi
if has hf; then
  for shape in small llama3-8b-2l smollm2; do
    echo "=== HF transformers logits check: $shape"
    timeout 240 python3 tests/gpu/hf_logits_check.py --shape "$shape" --workdir "/tmp/hfcheck-$shape" \
      --logits-tool "$carry/bin/lazyattn-logits" --device cuda --backend cuda 2>&1 |
      tee "$logs/hf-$shape.log" || status=1
  done
fi
if has hf && [ -f "$model" ] && python3 -c 'import gguf' 2>/dev/null; then
  echo "=== HF transformers logits check: SmolLM2 GGUF, golden prompts"
  timeout 300 python3 tests/gpu/hf_gguf_check.py --model "$model" \
    --logits-tool "$carry/bin/lazyattn-logits" --out "$logs/hf-gguf.json" 2>&1 |
    tee "$logs/hf-gguf.log" || status=1
fi
if has bench; then timeout 480 tests/gpu/bench.sh "$carry" || status=1; fi
if has engine; then
  echo "=== lazyattn-bench-engine"
  # shellcheck disable=SC2086
  timeout "${LAZYATTN_ENGINE_TIMEOUT:-420}" "$carry/bin/lazyattn-bench-engine" ${LAZYATTN_ENGINE_ARGS:-} 2>&1 | tee "$logs/bench-engine.log" ||
    status=1
fi
if has ab; then
  echo "=== A/B: lazyattn-bench-engine, two sets of flags alternated"
  OUT="$logs" timeout 580 tests/gpu/ab.sh "$carry" 2>&1 | tee "$logs/ab.log" || status=1
fi
if has cluster; then
  echo "=== tools/cluster-trace, one worker per GPU"
  gpus="$(nvidia-smi -L | wc -l)"
  # shellcheck disable=SC2086
  timeout "${LAZYATTN_CLUSTER_TIMEOUT:-540}" python3 tools/cluster-trace --bin-dir "$carry/bin" \
    --workers "$gpus" --gpus "$gpus" --backend cuda --model random:llama3-8b \
    --out "$logs/cluster-trace.json" ${LAZYATTN_CLUSTER_ARGS:-} 2>&1 | tee "$logs/cluster-trace.log" ||
    status=1
fi
if has clustertests; then
  echo "=== integration scenarios against CUDA workers"
  OUT="$logs" timeout 590 tests/gpu/cluster_tests.sh "$carry" "${LAZYATTN_CLUSTER_TESTS:-}" ||
    status=1
fi
if has overhead; then
  echo "=== router overheads on this machine's CPUs"
  OUT="$logs" timeout 560 tests/gpu/overhead.sh "$carry" "${LAZYATTN_OVERHEAD_ROUNDS:-3}" 2>&1 |
    tail -n 40 || status=1
fi
if has replay; then
  echo "=== lazyattn replay: greedy against sampled decoding"
  timeout 560 tests/gpu/sampled_replay.sh "$carry" 2>&1 | tee "$logs/sampled-replay.log" || status=1
fi
if has sanitize; then
  san="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1)"
  for tool in memcheck racecheck; do
    echo "=== compute-sanitizer --tool $tool"
    timeout 240 "$san" --tool "$tool" --error-exitcode 1 "$carry/bin/${LAZYATTN_SANITIZE_BIN:-kernels_cuda_ops_test}" \
      --gtest_filter="${LAZYATTN_SANITIZE_FILTER:-SampleRowsCudaTest.*:-*Draws*}" 2>&1 |
      tail -n 25 | tee "$logs/sanitize-$tool.log" || status=1
  done
fi
if has cpu; then
  echo "=== CPU kernels on this machine's CPU (SIMD paths the development box lacks)"
  grep -m1 -o 'avx512[a-z_]*\|avx_vnni\|avx2' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
  grep -m1 'model name' /proc/cpuinfo
  timeout 300 "$carry/bin/quant_linear_cpu_test" 2>&1 | tail -n 40 | tee "$logs/cpu-kernels.log" ||
    status=1
fi
if has ncu; then
  echo "=== ncu: kernel durations inside decode steps"
  ncu_bin="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda*/bin/ncu 2>/dev/null | head -n 1)"
  timeout 400 "$ncu_bin" --profile-from-start off --clock-control none --cache-control none \
    --metrics gpu__time_duration.sum --csv --log-file "$logs/ncu-decode.csv" \
    "$carry/bin/lazyattn-bench-engine" ${LAZYATTN_NCU_ARGS:---parts decode --batches 32} \
    --profile-decode-steps 2 \
    2>&1 | tail -n 30 | tee "$logs/ncu-run.log" || status=1
  python3 tests/gpu/ncu_summary.py "$logs/ncu-decode.csv" 2>&1 | tee "$logs/ncu-summary.log"
fi
if has ncuprefill; then
  echo "=== ncu: the kept prefill kernel (wgmma-ws, rotate-q) at q512 and q4096"
  ncu_bin="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda*/bin/ncu 2>/dev/null | head -n 1)"
  for shape in q512 q4096; do
    timeout 200 "$ncu_bin" --clock-control none -k regex:PagedPrefillWgmmaWs --launch-skip 1 \
      --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis \
      --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
      --section LaunchStats --section Occupancy --section InstructionStats \
      "$carry/bin/lazyattn-bench-prefill" --only="$shape" --variant=rotate-q \
      --kernel="${LAZYATTN_NCU_PREFILL_KERNEL:-wgmma-ws/pp-s5}" --reps=2 --warmup=1 \
      >"$logs/ncu-prefill-$shape.log" 2>&1 || status=1
    grep -E "Duration|Throughput|Stall|Issued|Eligible|Active Warps|Pipe|Hit Rate|Registers" \
      "$logs/ncu-prefill-$shape.log" | head -n 60
  done
fi
if has ncusource; then
  echo "=== ncu: per-instruction stall samples (tests/gpu/ncu_source.sh)"
  # shellcheck disable=SC2086
  OUT="$logs" timeout 560 tests/gpu/ncu_source.sh "$carry" ${LAZYATTN_NCU_SOURCE_PARTS:-} ||
    status=1
fi
if has hfbase; then
  echo "=== HF transformers baseline (llama3-8b, sdpa, bf16)"
  timeout 300 python3 tools/bench/hf_rag_baseline.py --shape llama3-8b --device cuda \
    --out "$logs/hf-baseline.json" 2>&1 | tee "$logs/hf-baseline.log" || status=1
fi
mkdir -p "$final_out"
tar -C "$logs" -czf "$final_out/gpu-logs.tgz" .
grep -h -E '^\[  (PASSED|FAILED) |^(PASS|FAIL)' "$logs"/*.log > "$final_out/summary.txt" 2>/dev/null
exit $status
