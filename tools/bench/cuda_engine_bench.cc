// The CUDA backend end to end on random weights of a named shape (default llama3-8b, generated on
// the GPU): RAG TTFT per cache mode and cache state, a RAG request at the whole 128K context,
// decode step time and batch throughput, a serving trace with Poisson arrivals and, when named,
// closed-loop saturation per cache mode. Prints markdown tables and one JSON line per result
// (tests/gpu/bench.sh collects them; docs/benchmarks.md has the numbers). One file per part:
// tools/bench/cuda_engine_bench.h.
//
//   lazyattn-bench-engine [--shape llama3-8b] [--parts gemm,kernels,ttft,long,decode,serving]
//                         [--saturation-requests 96] [--saturation-clients 16]
//                         [--kv-budget-gib 64]
//                         [--batches 32,0] [--serving-requests 60] [--serving-rates 2,6]
//                         [--serving-kv-gib 12] [--profile-decode-steps N] [--wgmma-gemm]
//                         [--profile-ttft-step] [--profile-cold-step]
//                         [--ttft-modes full,prefix,block,lazy]
//                         [--wgmma-max-rows N] [--fused-qkv-rope] [--no-wgmma-packed]
//                         [--no-early-kv-loads] [--no-pipeline-decode] [--decode-top-logprobs]
//                         [--decode-logit-bias N]
//                         [--prefill-kernel mma|wgmma-ws]
//                         [--wgmma-cuts qkv=64/2,o=64/4,gate_up=0/1,...]
//
// --profile-decode-steps N brackets N steady-state steps of every decode run with
// cudaProfilerStart/Stop, for `ncu --profile-from-start off` (tests/gpu/device.sh ncu): the
// kernels' durations inside real steps, where the timed-alone table above has warm caches.
// --profile-ttft-step does the same for the last all-cached lazy TTFT step (64 query rows),
// --profile-cold-step for one more cold lazy request's prefill (fresh documents, 1 token).
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "tools/bench/cuda_engine_bench.h"
#include "tools/cli/cli_args.h"

namespace lazyattn::engine_bench {
namespace {

int Main(int argc, char** argv) {
  CliArgs args;
  args.Declare("shape", CliArgs::Kind::kValue, "random model shape (default llama3-8b)");
  args.Declare("parts", CliArgs::Kind::kValue,
               "gemm,kernels,ttft,long,decode,serving (default), saturation");
  args.Declare("kv-budget-gib", CliArgs::Kind::kValue, "KV budget for ttft/decode (default 64)");
  args.Declare("batches", CliArgs::Kind::kValue,
               "decode batches at 2K context; 0 = the largest that fits (default 32,0)");
  args.Declare("serving-requests", CliArgs::Kind::kValue, "requests per trace (default 60)");
  args.Declare("serving-rates", CliArgs::Kind::kValue, "arrival rates, req/s (default 2,6)");
  args.Declare("serving-kv-gib", CliArgs::Kind::kValue,
               "KV budget of the serving and saturation traces (default 12)");
  args.Declare("saturation-requests", CliArgs::Kind::kValue,
               "requests per closed-loop trace (part saturation, only when named; default 96)");
  args.Declare("saturation-clients", CliArgs::Kind::kValue,
               "closed-loop clients (part saturation; default 16)");
  args.Declare("decode-top-logprobs", CliArgs::Kind::kSwitch,
               "part decode: also sampled batches with top_logprobs 5 on one / every request");
  args.Declare("decode-logit-bias", CliArgs::Kind::kValue,
               "part decode: also greedy and sampled batches whose every request has a logit "
               "bias of this many entries (default 0: none)");
  args.Declare("profile-decode-steps", CliArgs::Kind::kValue,
               "steady decode steps inside cudaProfilerStart/Stop, per decode run (default 0)");
  args.Declare("profile-ttft-step", CliArgs::Kind::kSwitch,
               "part ttft: the last all-cached lazy step inside cudaProfilerStart/Stop");
  args.Declare("profile-cold-step", CliArgs::Kind::kSwitch,
               "part ttft: one more cold lazy request (1 output token) inside "
               "cudaProfilerStart/Stop");
  args.Declare("ttft-modes", CliArgs::Kind::kValue,
               "part ttft: cache modes to run (default full,prefix,block,lazy)");
  args.Declare("no-residual-in-products", CliArgs::Kind::kSwitch,
               "runner: prefill o/down products write a delta that the next norm adds (to "
               "compare)");
  args.Declare("no-skinny", CliArgs::Kind::kSwitch, "one-row GEMMs on cuBLASLt (to compare)");
  args.Declare("no-fused-norms", CliArgs::Kind::kSwitch,
               "batch 1: RMSNorms as launches of their own (to compare)");
  args.Declare("wgmma-gemm", CliArgs::Kind::kSwitch,
               "gemm part: also time the few-row wgmma kernel");
  args.Declare("wgmma-max-rows", CliArgs::Kind::kValue,
               "runner: steps of 2..N rows on the wgmma kernel (0 = none; default the runner's)");
  args.Declare("fused-qkv-rope", CliArgs::Kind::kSwitch,
               "runner: RoPE and the K/V append in the wgmma QKV product (head_dim 128)");
  args.Declare("no-wgmma-packed", CliArgs::Kind::kSwitch,
               "runner: the wgmma kernel reads the row-major weights, no packed copy (to compare)");
  args.Declare("prefill-kernel", CliArgs::Kind::kValue,
               "runner: prefill attention kernel, mma or wgmma-ws (default the runner's)");
  args.Declare("prefill-variant", CliArgs::Kind::kValue,
               "runner: wgmma-ws compiled variant (PagedPrefillArgs::variant; default 0)");
  args.Declare("no-pipeline-decode", CliArgs::Kind::kSwitch,
               "engine: read each decode step's tokens before launching the next (to compare)");
  args.Declare("no-early-kv-loads", CliArgs::Kind::kSwitch,
               "runner: decode attention waits for the K/V append before any copy (to compare)");
  args.Declare("wgmma-cuts", CliArgs::Kind::kValue,
               "runner: wgmma cut per product, product=features/splits (0 = the kernel's)");
  args.Declare("no-overlap", CliArgs::Kind::kSwitch,
               "launch kernels without programmatic dependent launch (to compare)");
  if (absl::Status s = args.Parse(argc, argv, 1); !s.ok()) {
    std::cerr << s.message() << "\n" << args.Help();
    return 2;
  }
  Bench b;
  auto config = NamedModelShape(args.String("shape", "llama3-8b"));
  if (!config.ok()) {
    std::cerr << config.status().message() << "\n";
    return 2;
  }
  b.config = *config;
  b.skinny_gemms = !args.Has("no-skinny");
  b.profile_ttft_step = args.Has("profile-ttft-step");
  b.profile_cold_step = args.Has("profile-cold-step");
  b.residual_in_products = !args.Has("no-residual-in-products");
  if (args.Has("ttft-modes")) {
    b.ttft_modes.clear();
    for (absl::string_view name : absl::StrSplit(args.String("ttft-modes"), ',')) {
      auto mode = ParseCacheMode(std::string_view(name.data(), name.size()));
      if (!mode.ok()) {
        std::cerr << "--ttft-modes: " << mode.status().message() << "\n";
        return 2;
      }
      if (std::find(b.ttft_modes.begin(), b.ttft_modes.end(), *mode) != b.ttft_modes.end()) {
        std::cerr << "--ttft-modes: " << name << " named twice\n";
        return 2;
      }
      b.ttft_modes.push_back(*mode);
    }
  }
  if (b.profile_cold_step &&
      std::find(b.ttft_modes.begin(), b.ttft_modes.end(), CacheMode::kLazy) == b.ttft_modes.end()) {
    std::cerr << "--profile-cold-step profiles a lazy request: --ttft-modes must include lazy\n";
    return 2;
  }
  b.fused_norms = !args.Has("no-fused-norms");
  b.fused_qkv_rope = args.Has("fused-qkv-rope");
  b.wgmma_packed_weights = !args.Has("no-wgmma-packed");
  b.early_decode_kv_loads = !args.Has("no-early-kv-loads");
  b.pipeline_decode = !args.Has("no-pipeline-decode");
  if (args.Has("prefill-kernel")) {
    const std::string k = args.String("prefill-kernel");
    if (k == "mma") {
      b.prefill_kernel = PrefillKernel::kMmaSync;
    } else if (k == "wgmma-ws") {
      b.prefill_kernel = PrefillKernel::kWgmmaWs;
    } else {
      // "wgmma" named the first wgmma kernel, since removed: refused like any other name.
      std::cerr << "--prefill-kernel: mma or wgmma-ws, not " << k << "\n";
      return 2;
    }
  }
  b.prefill_variant = static_cast<int>(args.Int("prefill-variant", 0).value_or(0));
  b.wgmma_max_rows = static_cast<int>(args.Int("wgmma-max-rows", b.wgmma_max_rows)
                                          .value_or(b.wgmma_max_rows));
  for (absl::string_view item : absl::StrSplit(args.String("wgmma-cuts", ""), ',',
                                               absl::SkipEmpty())) {
    const std::vector<std::string> kv = absl::StrSplit(item, absl::ByAnyChar("=/"));
    int features = 0, splits = 0;
    SkinnyWgmmaConfig* cut = kv.empty()                 ? nullptr
                             : kv[0] == "qkv"           ? &b.wgmma_cuts.qkv
                             : kv[0] == "o"             ? &b.wgmma_cuts.o
                             : kv[0] == "gate_up"       ? &b.wgmma_cuts.gate_up
                             : kv[0] == "down"          ? &b.wgmma_cuts.down
                                                        : nullptr;
    if (cut == nullptr || kv.size() != 3 || !absl::SimpleAtoi(kv[1], &features) ||
        !absl::SimpleAtoi(kv[2], &splits)) {
      std::cerr << "--wgmma-cuts: expected product=features/splits, got " << item << "\n";
      return 2;
    }
    *cut = {.tile_features = features, .splits = splits};
  }
  // Read once, at the first launch (kernels/cuda/launch_overlap.cuh).
  if (args.Has("no-overlap")) setenv("LAZYATTN_OVERLAP_LAUNCHES", "0", /*overwrite=*/1);
  const std::string parts = args.String("parts", "gemm,kernels,ttft,long,decode,serving");
  const int64_t gib = int64_t{1} << 30;
  const int64_t budget = args.Int("kv-budget-gib", 64).value_or(64) * gib;
  std::vector<int> batches;
  for (absl::string_view s : absl::StrSplit(args.String("batches", "32,0"), ',')) {
    int v = 0;
    if (absl::SimpleAtoi(s, &v)) batches.push_back(v);
  }
  std::vector<double> rates;
  for (absl::string_view s : absl::StrSplit(args.String("serving-rates", "2,6"), ',')) {
    double v = 0;
    if (absl::SimpleAtod(s, &v)) rates.push_back(v);
  }
  json out = {{"shape", b.config.name}};
  absl::Status status;
  if (status.ok() && (parts.find("gemm") != std::string::npos ||
                      parts.find("kernels") != std::string::npos)) {
    status = RunGemms(b.config, args.Has("wgmma-gemm"), parts.find("gemm") != std::string::npos,
                      parts.find("kernels") != std::string::npos, out);
  }
  if (status.ok() && parts.find("ttft") != std::string::npos) status = RunTtft(b, budget, out);
  if (status.ok() && parts.find("long") != std::string::npos) {
    status = RunLongContext(b, budget, out);
  }
  if (status.ok() && parts.find("decode") != std::string::npos) {
    status = RunDecode(b, budget, batches,
                       static_cast<int>(args.Int("profile-decode-steps", 0).value_or(0)),
                       args.Has("decode-top-logprobs"),
                       static_cast<int>(args.Int("decode-logit-bias", 0).value_or(0)), out);
  }
  if (status.ok() && parts.find("serving") != std::string::npos) {
    status = RunServing(b, args.Int("serving-kv-gib", 12).value_or(12) * gib,
                        static_cast<int>(args.Int("serving-requests", 60).value_or(60)), rates, out);
  }
  if (status.ok() && parts.find("saturation") != std::string::npos) {
    status = RunSaturation(b, args.Int("serving-kv-gib", 12).value_or(12) * gib,
                           static_cast<int>(args.Int("saturation-requests", 96).value_or(96)),
                           static_cast<int>(args.Int("saturation-clients", 16).value_or(16)), out);
  }
  std::cout << out.dump() << "\n";
  if (!status.ok()) {
    std::cerr << "lazyattn-bench-engine: " << status.message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace lazyattn::engine_bench

int main(int argc, char** argv) { return lazyattn::engine_bench::Main(argc, argv); }
