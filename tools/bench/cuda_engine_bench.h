// Shared pieces of lazyattn-bench-engine (cuda_engine_bench.cc): the benchmark's settings and
// engine factory, its synthetic documents and RAG requests, and a trace runner. Each part of the
// benchmark (gemm/kernels, ttft, long, decode, serving, saturation) lives in a file of its own.
#ifndef LAZYATTN_TOOLS_BENCH_CUDA_ENGINE_BENCH_H_
#define LAZYATTN_TOOLS_BENCH_CUDA_ENGINE_BENCH_H_

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "services/worker/cache/cache_mode.h"
#include "services/worker/cuda/cuda_model_runner.h"
#include "services/worker/engine/engine.h"
#include "services/worker/model/random_weights.h"
#include "services/worker/model/tokenizer/byte_tokenizer.h"

namespace lazyattn::engine_bench {

using json = nlohmann::json;

// The p-quantile (0 < p <= 1) of `v` by the nearest-rank rule; 0 for an empty `v`.
double Percentile(std::vector<double> v, double p);

// Token ids for document `id`: distinct per document, deterministic, inside any vocabulary the
// benchmark uses (the byte tokenizer's ids stay below 256, so generation never stops on EOS).
std::vector<int32_t> DocumentTokens(int id, int length);

// A RAG request over documents `docs` of `doc_tokens` tokens each and a 64-token question.
EngineRequest RagRequest(const std::vector<int>& docs, int doc_tokens, int question_id,
                         CacheMode mode, int max_tokens);

struct Bench {
  ModelConfig config;
  std::unique_ptr<Tokenizer> tokenizer = MakeByteTokenizer();
  int max_batch_tokens = 8192;
  bool skinny_gemms = true;
  bool fused_norms = true;
  int wgmma_max_rows = CudaRunnerOptions{}.wgmma_max_rows;
  CudaRunnerOptions::WgmmaCuts wgmma_cuts;
  bool fused_qkv_rope = false;
  bool wgmma_packed_weights = CudaRunnerOptions{}.wgmma_packed_weights;
  bool early_decode_kv_loads = CudaRunnerOptions{}.early_decode_kv_loads;
  bool pipeline_decode = EngineOptions{}.pipeline_decode;
  PrefillKernel prefill_kernel = CudaRunnerOptions{}.prefill_kernel;
  int prefill_variant = CudaRunnerOptions{}.prefill_variant;
  // Part ttft: the last all-cached lazy step inside cudaProfilerStart/Stop, for
  // `ncu --profile-from-start off` (tests/gpu/device.sh ncu with LAZYATTN_NCU_ARGS).
  bool profile_ttft_step = false;
  // Part ttft: after the timed repeats, one more cold lazy request (5 fresh documents, one
  // output token) inside cudaProfilerStart/Stop: where a cold prefill's time goes.
  bool profile_cold_step = false;
  bool residual_in_products = CudaRunnerOptions{}.residual_in_products;
  // Part ttft: the cache modes it runs, in this order.
  std::vector<CacheMode> ttft_modes = {CacheMode::kFull, CacheMode::kPrefix, CacheMode::kBlock,
                                       CacheMode::kLazy};

  CudaModelRunner* runner = nullptr;  // of the last engine made (owned by it)

  absl::StatusOr<std::unique_ptr<Engine>> MakeEngine(int64_t kv_budget, int max_running) {
    ASSIGN_OR_RETURN(auto weights, CudaModelWeights::Random(config, /*seed=*/1));
    ASSIGN_OR_RETURN(auto runner, CudaModelRunner::Create(std::move(weights),
                                                          {.kv_budget_bytes = kv_budget,
                                                           .skinny_gemms = skinny_gemms,
                                                           .fused_norms = fused_norms,
                                                           .residual_in_products =
                                                               residual_in_products,
                                                           .wgmma_max_rows = wgmma_max_rows,
                                                           .fused_qkv_rope = fused_qkv_rope,
                                                           .wgmma_packed_weights =
                                                               wgmma_packed_weights,
                                                           .early_decode_kv_loads =
                                                               early_decode_kv_loads,
                                                           .prefill_kernel = prefill_kernel,
                                                           .prefill_variant = prefill_variant,
                                                           .wgmma_cuts = wgmma_cuts}));
    this->runner = runner.get();
    return std::make_unique<Engine>(std::move(runner), "random-" + config.name, tokenizer.get(),
                                    EngineOptions{.max_batch_tokens = max_batch_tokens,
                                                  .max_running = max_running,
                                                  .pipeline_decode = pipeline_decode});
  }
};

// Submits `requests` at `arrival` offsets (seconds) and waits for all; returns per-request
// results and the wall time from the first submission to the last completion. The callbacks run
// on the engine thread between steps (safe to touch the runner).
struct TraceResult {
  std::vector<RequestResult> results;
  std::vector<absl::Time> token_times;  // every streamed token
  std::vector<absl::Time> first_token;  // per request
  absl::Time start, end;
  absl::Time first_done = absl::InfiniteFuture();
  int failures = 0;
};

TraceResult RunTrace(Engine& engine, const std::vector<EngineRequest>& requests,
                     const std::vector<double>& arrival,
                     std::function<void()> on_all_started = {},
                     std::function<void()> on_token_after_start = {},
                     std::function<void()> on_first_done = {});

// The parts; each prints a markdown table and adds its results to `out`.
absl::Status RunGemms(const ModelConfig& c, bool with_wgmma, bool gemms, bool kernels, json& out);
absl::Status RunTtft(Bench& b, int64_t kv_budget, json& out);
absl::Status RunLongContext(Bench& b, int64_t kv_budget, json& out);
// `top_logprobs`: also the sampled rows of `batches` with SamplingParams::top_logprobs 5 on one
// request of the batch, then on every request (what their logits' trip to the host costs).
// `logit_bias` > 0: also greedy and sampled rows whose every request has a logit bias of that
// many entries (what sending greedy rows through the sampler, and the entries, cost).
absl::Status RunDecode(Bench& b, int64_t kv_budget, const std::vector<int>& batches,
                       int profile_steps, bool top_logprobs, int logit_bias, json& out);
absl::Status RunServing(Bench& b, int64_t kv_budget, int num_requests,
                        const std::vector<double>& rates, json& out);
absl::Status RunSaturation(Bench& b, int64_t kv_budget, int num_requests, int clients, json& out);

}  // namespace lazyattn::engine_bench

#endif  // LAZYATTN_TOOLS_BENCH_CUDA_ENGINE_BENCH_H_
