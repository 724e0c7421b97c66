// The CUDA backend end to end on random weights of a named shape (default llama3-8b, generated on
// the GPU): RAG TTFT per cache mode and cache state, decode step time and batch throughput, and a
// serving trace with Poisson arrivals. Prints markdown tables and one JSON line per result
// (tests/gpu/bench.sh collects them; docs/benchmarks.md has the numbers).
//
//   lazyattn-bench-engine [--shape llama3-8b] [--parts gemm,kernels,ttft,decode,serving]
//                         [--kv-budget-gib 64]
//                         [--batches 32,0] [--serving-requests 60] [--serving-rates 2,6]
//                         [--serving-kv-gib 12] [--profile-decode-steps N] [--wgmma-gemm]
//                         [--wgmma-max-rows N] [--fused-qkv-rope] [--no-wgmma-packed]
//                         [--no-early-kv-loads] [--no-pipeline-decode]
//                         [--prefill-kernel mma|wgmma]
//                         [--wgmma-cuts qkv=64/2,o=64/4,gate_up=0/1,...]
//
// --profile-decode-steps N brackets N steady-state steps of every decode run with
// cudaProfilerStart/Stop, for `ncu --profile-from-start off` (tests/gpu/device.sh ncu): the
// kernels' durations inside real steps, where the timed-alone table above has warm caches.
#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <iostream>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <thread>

#include <cuda_profiler_api.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/paged_decode_attention.h"
#include "kernels/cuda/skinny_wgmma_linear.h"
#include "kernels/cuda/rms_norm.h"
#include "kernels/cuda/rope_kv_append.h"
#include "kernels/cuda/rope_table_cuda.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/swiglu.h"
#include "services/worker/cuda/cuda_model_runner.h"
#include "services/worker/cuda/weight_fill.h"
#include "services/worker/engine/engine.h"
#include "services/worker/model/tokenizer/byte_tokenizer.h"
#include "services/worker/model/random_weights.h"
#include "tools/cli/cli_args.h"

namespace lazyattn {
namespace {

using json = nlohmann::json;

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(std::ceil(p * v.size())) - 1);
  return v[i];
}

// Token ids for document `id`: distinct per document, deterministic, inside any vocabulary the
// benchmark uses (the byte tokenizer's ids stay below 256, so generation never stops on EOS).
std::vector<int32_t> DocumentTokens(int id, int length) {
  std::mt19937 rng(1000003u * static_cast<uint32_t>(id) + 17);
  std::vector<int32_t> t(length);
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % 250);
  return t;
}

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

  CudaModelRunner* runner = nullptr;  // of the last engine made (owned by it)

  absl::StatusOr<std::unique_ptr<Engine>> MakeEngine(int64_t kv_budget, int max_running) {
    ASSIGN_OR_RETURN(auto weights, CudaModelWeights::Random(config, /*seed=*/1));
    ASSIGN_OR_RETURN(auto runner, CudaModelRunner::Create(std::move(weights),
                                                          {.kv_budget_bytes = kv_budget,
                                                           .skinny_gemms = skinny_gemms,
                                                           .fused_norms = fused_norms,
                                                           .wgmma_max_rows = wgmma_max_rows,
                                                           .fused_qkv_rope = fused_qkv_rope,
                                                           .wgmma_packed_weights =
                                                               wgmma_packed_weights,
                                                           .early_decode_kv_loads =
                                                               early_decode_kv_loads,
                                                           .prefill_kernel = prefill_kernel,
                                                           .wgmma_cuts = wgmma_cuts}));
    this->runner = runner.get();
    return std::make_unique<Engine>(std::move(runner), "random-" + config.name, tokenizer.get(),
                                    EngineOptions{.max_batch_tokens = max_batch_tokens,
                                                  .max_running = max_running,
                                                  .pipeline_decode = pipeline_decode});
  }
};

EngineRequest RagRequest(const std::vector<int>& docs, int doc_tokens, int question_id,
                         CacheMode mode, int max_tokens) {
  EngineRequest r{.mode = mode, .sampling = {.max_tokens = max_tokens, .ignore_eos = true}};
  for (int d : docs) {
    r.documents.push_back({.id = absl::StrCat("doc", d), .token_ids = DocumentTokens(d, doc_tokens)});
  }
  r.question_token_ids = DocumentTokens(-1 - question_id, 64);
  return r;
}

// --- TTFT of a 5 x 4,096-token RAG request: cold, 3 of 5 cached, all cached, per mode. ---
absl::Status RunTtft(Bench& b, int64_t kv_budget, json& out) {
  std::cout << "\n### RAG TTFT (5 documents x 4,096 tokens + 64-token question, 128 output "
               "tokens; documents reordered between requests)\n\n"
            << "| mode | cold ms | 3 of 5 cached ms | all cached ms | decode tok/s | "
               "all cached, its step: GPU / Forward / launch ms |\n|---|---|---|---|---|---|\n";
  constexpr int kRepeats = 3;
  for (CacheMode mode : {CacheMode::kFull, CacheMode::kPrefix, CacheMode::kBlock,
                         CacheMode::kLazy}) {
    ASSIGN_OR_RETURN(auto engine, b.MakeEngine(kv_budget, 64));
    // Warm-up (cuBLAS plans, first-touch allocations) on documents used nowhere else.
    RETURN_IF_ERROR(engine->Run(RagRequest({900, 901, 902, 903, 904}, 4096, 0, mode, 8)).status());
    std::vector<double> cold, partial, warm, decode, step_gpu, step_wall, step_launch;
    for (int rep = 0; rep < kRepeats; ++rep) {
      const int base = 10 * rep;  // fresh documents every repeat
      const int q = 100 + 3 * rep;
      ASSIGN_OR_RETURN(auto r1, engine->Run(RagRequest({base + 1, base + 2, base + 3, base + 4,
                                                        base + 5}, 4096, q, mode, 128)));
      ASSIGN_OR_RETURN(auto r2, engine->Run(RagRequest({base + 3, base + 1, base + 6, base + 2,
                                                        base + 7}, 4096, q + 1, mode, 128)));
      ASSIGN_OR_RETURN(auto r3, engine->Run(RagRequest({base + 5, base + 4, base + 3, base + 2,
                                                        base + 1}, 4096, q + 2, mode, 128)));
      cold.push_back(r1.ttft_ms);
      partial.push_back(r2.ttft_ms);
      warm.push_back(r3.ttft_ms);
      decode.push_back(r1.decode_tokens_per_s);
      // Where an all-cached TTFT goes: the same documents once more, one output token, so the
      // runner's profile holds exactly the step that makes the first token.
      b.runner->set_profiling(true);
      ASSIGN_OR_RETURN(auto r4, engine->Run(RagRequest({base + 2, base + 5, base + 1, base + 4,
                                                        base + 3}, 4096, q + 3, mode, 1)));
      const CudaModelRunner::StepProfile prof = b.runner->profile();
      b.runner->set_profiling(false);
      step_gpu.push_back(prof.steps ? prof.gpu_ms / prof.steps : 0);
      step_wall.push_back(prof.steps ? prof.forward_wall_ms / prof.steps : 0);
      step_launch.push_back(prof.steps ? prof.enqueue_ms / prof.steps : 0);
    }
    const auto med = [](std::vector<double> v) { return Percentile(std::move(v), 0.5); };
    std::cout << absl::StrCat("| ", std::string(CacheModeName(mode)), " | ", med(cold), " | ", med(partial),
                              " | ", med(warm), " | ", med(decode), " | ", med(step_gpu), " / ",
                              med(step_wall), " / ", med(step_launch), " |\n");
    out["ttft"][std::string(CacheModeName(mode))] = {{"cold_ms", med(cold)},
                                                    {"three_cached_ms", med(partial)},
                                                    {"all_cached_ms", med(warm)},
                                                    {"decode_tok_s", med(decode)},
                                                    {"all_cached_step_gpu_ms", med(step_gpu)},
                                                    {"all_cached_step_forward_ms", med(step_wall)},
                                                    {"all_cached_step_launch_ms", med(step_launch)}};
  }
  return absl::OkStatus();
}

// Submits `requests` at `arrival` offsets (seconds) and waits for all; returns per-request
// results and the wall time from the first submission to the last completion.
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
                     std::function<void()> on_first_done = {}) {
  TraceResult t;
  std::mutex mu;
  std::condition_variable cv;
  int done = 0;
  size_t started = 0;
  t.results.resize(requests.size());
  t.first_token.resize(requests.size(), absl::InfiniteFuture());
  t.start = absl::Now();
  for (size_t i = 0; i < requests.size(); ++i) {
    const absl::Time at = t.start + absl::Seconds(arrival[i]);
    if (absl::Now() < at) absl::SleepFor(at - absl::Now());
    RequestCallbacks cb;
    cb.on_token = [&, i, first = true](int32_t, std::string_view) mutable {
      std::lock_guard<std::mutex> lock(mu);
      t.token_times.push_back(absl::Now());
      if (first) t.first_token[i] = t.token_times.back();
      // Runs on the engine thread between steps: safe to touch the runner.
      if (started == requests.size() && on_token_after_start) on_token_after_start();
      if (first && ++started == requests.size() && on_all_started) on_all_started();
      first = false;
    };
    cb.on_done = [&, i](const absl::Status& s, const RequestResult& r) {
      std::lock_guard<std::mutex> lock(mu);
      if (!s.ok()) ++t.failures;
      t.results[i] = r;
      // Runs on the engine thread between steps, like on_token.
      if (t.first_done == absl::InfiniteFuture() && on_first_done) on_first_done();
      t.first_done = std::min(t.first_done, absl::Now());
      ++done;
      cv.notify_all();
    };
    if (!engine.Submit(requests[i], std::move(cb)).ok()) {
      std::lock_guard<std::mutex> lock(mu);
      ++t.failures;
      ++done;
    }
  }
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done == static_cast<int>(requests.size()); });
  t.end = absl::Now();
  return t;
}

// --- Decode: batch 1 at 20K context, batch 32 at 2K, and the largest batch that fits. ---
absl::Status RunDecode(Bench& b, int64_t kv_budget, const std::vector<int>& batches,
                       int profile_steps, json& out) {
  std::cout << "\n### Decode\n\n| batch | context | sampling | step ms | output tok/s | GPU ms/step | "
               "runner wall ms/step | host prep ms/step | launch ms/step | "
               "engine ms between steps | CUDA graph replays |\n"
               "|---|---|---|---|---|---|---|---|---|---|---|\n";
  ASSIGN_OR_RETURN(auto engine, b.MakeEngine(kv_budget, 512));
  // `sampled`: temperature 0.8, top-p 0.95, a seed per request (the sampled decode row).
  auto one = [&](int batch, int context, int steps, bool sampled) -> absl::Status {
    std::vector<EngineRequest> reqs;
    for (int i = 0; i < batch; ++i) {
      EngineRequest r{.mode = CacheMode::kFull,
                      .sampling = {.max_tokens = steps, .ignore_eos = true}};
      if (sampled) {
        r.sampling.temperature = 0.8f;
        r.sampling.top_p = 0.95f;
        r.sampling.seed = 7 + i;
      }
      r.question_token_ids = DocumentTokens(5000 + 1000 * context + i, context);
      reqs.push_back(std::move(r));
    }
    b.runner->set_profiling(false);
    const int64_t replays_before = b.runner->graph_launches();
    // The profiler window counts tokens of the whole batch: it opens after two all-decode steps
    // (the eager one, which autotunes new GEMM shapes, and the graph capture) and stays open
    // for `profile_steps` steps of `batch` tokens.
    int64_t skip_tokens = -1, window_tokens = -1;
    // The runner's profile of the steps with the whole batch decoding: taken when the first
    // request finishes, before the tail's smaller (faster) steps.
    std::optional<CudaModelRunner::StepProfile> full_batch_profile;
    const TraceResult t = RunTrace(
        *engine, reqs, std::vector<double>(batch, 0.0),
        [&] {
          b.runner->set_profiling(true);  // from the first all-decode step on
          if (profile_steps > 0) skip_tokens = int64_t{2} * batch;
        },
        [&] {
          if (skip_tokens > 0 && --skip_tokens == 0) {
            cudaProfilerStart();
            window_tokens = int64_t{profile_steps} * batch;
          } else if (window_tokens > 0 && --window_tokens == 0) {
            cudaProfilerStop();
          }
        },
        [&] { full_batch_profile = b.runner->profile(); });
    if (window_tokens > 0) cudaProfilerStop();
    if (t.failures > 0) return absl::InternalError(absl::StrCat(t.failures, " requests failed"));
    // Steady state: every request decoding, from the last first token to the first request
    // that finishes (earlier starters finish earlier; the tail has a smaller batch). The window
    // runs from the first token of the first all-decode step to the last token of the first
    // request to finish (the oldest, first in every step's tokens), counting the tokens before
    // it: whole steps of tokens over as many steps of time. (Timed from the last first token to
    // that request's on_done, as before, it held one step more of time than of tokens at batch
    // 32: the finishing step's other tokens come after the on_done.)
    absl::Time all_started = t.start;
    for (absl::Time at : t.first_token) all_started = std::max(all_started, at);
    absl::Time window_start = absl::InfiniteFuture(), window_end = absl::InfinitePast();
    for (absl::Time at : t.token_times) {
      if (at > all_started) window_start = std::min(window_start, at);
      if (at <= t.first_done) window_end = std::max(window_end, at);
    }
    int64_t tokens = 0;
    for (absl::Time at : t.token_times) tokens += at >= window_start && at < window_end;
    const double seconds = absl::ToDoubleSeconds(window_end - window_start);
    if (tokens <= 0 || seconds <= 0) {
      return absl::InternalError(absl::StrCat("batch ", batch, ": no steady decode steps"));
    }
    const double tok_s = tokens / seconds;
    const double step_ms = 1000.0 * batch / tok_s;
    const CudaModelRunner::StepProfile prof = full_batch_profile.value_or(b.runner->profile());
    const double gpu_ms = prof.steps ? prof.gpu_ms / prof.steps : 0;
    const double prep_ms = prof.steps ? prof.prep_ms / prof.steps : 0;
    const double wall_ms = prof.steps ? prof.forward_wall_ms / prof.steps : 0;
    const double launch_ms = prof.steps ? prof.enqueue_ms / prof.steps : 0;
    const double between_ms = prof.steps > 1 ? prof.between_ms / (prof.steps - 1) : 0;
    const int64_t replays = b.runner->graph_launches() - replays_before;
    std::cout << absl::StrCat("| ", batch, " | ", context, " | ",
                              sampled ? "T 0.8 top-p 0.95" : "greedy", " | ", step_ms, " | ",
                              tok_s, " | ",
                              gpu_ms, " | ", wall_ms, " | ", prep_ms, " | ", launch_ms - prep_ms,
                              " | ", between_ms, " | ",
                              replays, " |\n");
    out["decode"].push_back({{"batch", batch}, {"context", context},
                             {"sampling", sampled ? "t0.8_p0.95" : "greedy"}, {"step_ms", step_ms},
                             {"tok_s", tok_s}, {"gpu_ms", gpu_ms}, {"runner_wall_ms", wall_ms},
                             {"host_prep_ms", prep_ms}, {"launch_ms", launch_ms - prep_ms},
                             {"engine_between_ms", between_ms},
                             {"graph_replays", replays}});
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(one(1, 2048, 16, false));  // warm-up, not reported separately
  RETURN_IF_ERROR(one(1, 2048, 16, true));
  for (bool sampled : {false, true}) RETURN_IF_ERROR(one(1, 20480, 128, sampled));
  for (bool sampled : {false, true}) RETURN_IF_ERROR(one(1, 2048, 128, sampled));
  // 0 in --batches: the largest batch of 2K-context requests (plus 128 outputs) the pool holds.
  const int64_t blocks_per_request = (2048 + 128 + kDefaultKvBlockSize - 1) / kDefaultKvBlockSize;
  for (int batch : batches) {
    if (batch == 0) batch = static_cast<int>(engine->blocks().total / blocks_per_request);
    for (bool sampled : {false, true}) RETURN_IF_ERROR(one(batch, 2048, 128, sampled));
  }
  return absl::OkStatus();
}

// --- Serving: RAG requests over a document pool, Zipf or uniform, Poisson arrivals. ---
absl::Status RunServing(Bench& b, int64_t kv_budget, int num_requests,
                        const std::vector<double>& rates, json& out) {
  constexpr int kPool = 120, kDocTokens = 2048, kDocsPerRequest = 5, kOutput = 32;
  std::cout << "\n### Serving trace (" << kPool << " documents x " << kDocTokens << " tokens, "
            << kDocsPerRequest << " per request, " << kOutput << " output tokens, " << num_requests
            << " requests, KV budget " << (kv_budget >> 30) << " GiB)\n\n"
            << "| docs | rate req/s | mode | doc hit ratio | TTFT mean ms | TTFT p50 ms | "
               "TTFT p99 ms | req/s | output tok/s |\n|---|---|---|---|---|---|---|---|---|\n";
  for (const char* dist : {"zipf2.1", "uniform"}) {
    for (double rate : rates) {
      // One trace per (distribution, rate), replayed identically in every mode.
      std::mt19937_64 rng(42);
      std::vector<double> weight(kPool);
      for (int i = 0; i < kPool; ++i) {
        weight[i] = std::string(dist) == "uniform" ? 1.0 : std::pow(i + 1.0, -2.1);
      }
      std::discrete_distribution<int> pick(weight.begin(), weight.end());
      std::exponential_distribution<double> gap(rate);
      std::vector<std::vector<int>> docs(num_requests);
      std::vector<double> arrival(num_requests);
      double at = 0;
      for (int i = 0; i < num_requests; ++i) {
        while (static_cast<int>(docs[i].size()) < kDocsPerRequest) {
          const int d = pick(rng);
          if (std::find(docs[i].begin(), docs[i].end(), d) == docs[i].end()) docs[i].push_back(d);
        }
        arrival[i] = at;
        at += gap(rng);
      }
      for (CacheMode mode : {CacheMode::kPrefix, CacheMode::kBlock, CacheMode::kLazy}) {
        ASSIGN_OR_RETURN(auto engine, b.MakeEngine(kv_budget, 64));
        std::vector<EngineRequest> reqs;
        for (int i = 0; i < num_requests; ++i) {
          reqs.push_back(RagRequest(docs[i], kDocTokens, i, mode, kOutput));
        }
        const TraceResult t = RunTrace(*engine, reqs, arrival);
        std::vector<double> ttft;
        int64_t hits = 0, total_docs = 0, out_tokens = 0;
        for (const RequestResult& r : t.results) {
          ttft.push_back(r.ttft_ms);
          hits += r.usage.documents_hit;
          total_docs += r.usage.documents;
          out_tokens += static_cast<int64_t>(r.token_ids.size());
        }
        const double seconds = absl::ToDoubleSeconds(t.end - t.start);
        const double hit_ratio = total_docs > 0 ? double(hits) / total_docs : 0;
        // The paper compares mean TTFT; the median and p99 show the shape of the distribution.
        const double ttft_mean =
            ttft.empty() ? 0 : std::accumulate(ttft.begin(), ttft.end(), 0.0) / ttft.size();
        std::cout << absl::StrCat("| ", dist, " | ", rate, " | ", std::string(CacheModeName(mode)), " | ",
                                  hit_ratio, " | ", ttft_mean, " | ", Percentile(ttft, 0.5), " | ",
                                  Percentile(ttft, 0.99), " | ", num_requests / seconds, " | ",
                                  out_tokens / seconds, " |", t.failures ? " failures!" : "",
                                  "\n");
        out["serving"].push_back({{"dist", dist},
                                  {"rate", rate},
                                  {"mode", std::string(CacheModeName(mode))},
                                  {"doc_hit_ratio", hit_ratio},
                                  {"ttft_mean_ms", ttft_mean},
                                  {"ttft_p50_ms", Percentile(ttft, 0.5)},
                                  {"ttft_p99_ms", Percentile(ttft, 0.99)},
                                  {"req_s", num_requests / seconds},
                                  {"out_tok_s", out_tokens / seconds},
                                  {"failures", t.failures}});
      }
    }
  }
  return absl::OkStatus();
}

// --- The decode step's GEMMs alone: what the runner uses (the skinny kernel for 1-4 rows,
// cuBLASLt with the autotuned algorithm above), and cuBLASLt alone for the skinny rows. ---
// "Cold" rotates over copies of the weights that together exceed the 50 MB L2, as inside a step
// where each layer's weights are read once; "warm" repeats one copy (the o projection's 33.5 MB
// then sit in L2, which is how a timed-alone loop flatters it).
// `gemms`: the GEMM table; `kernels`: the other kernels' table (the sampler among them).
absl::Status RunGemms(const ModelConfig& c, bool with_wgmma, bool gemms, bool kernels, json& out) {
  if (gemms) std::cout << "\n### Decode-shaped GEMMs (" << c.name << " weights, bf16, fp32 accumulate)\n\n"
            << "| rows | product | warm us | cold us | cold weight TB/s | cuBLASLt cold us | "
               "wgmma swap-AB cold us (features/splits) | best wgmma cut cold us |\n"
            << "|---|---|---|---|---|---|---|---|\n";
  struct Shape {
    const char* name;
    int64_t in, out;
    GemmOutputType type;
  };
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  // Output types as in the runner: the o and down projections add into the fp32 residual.
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  if (gemms) {
  const Shape shapes[] = {{"qkv", H, c.q_size() + 2 * c.kv_size(), GemmOutputType::kBf16},
                          {"o", c.q_size(), H, GemmOutputType::kFp32},
                          {"gate_up", H, 2 * I, GemmOutputType::kBf16},
                          {"down", I, H, GemmOutputType::kFp32},
                          {"lm_head", H, c.vocab_size, GemmOutputType::kFp32}};
  ASSIGN_OR_RETURN(auto tuned, CublasLtGemm::Create());
  ASSIGN_OR_RETURN(auto cublas_only, CublasLtGemm::Create());
  cublas_only->set_skinny(false);
  SkinnyWgmmaWorkspace wgmma_ws;
  if (with_wgmma) RETURN_IF_ERROR(wgmma_ws.Init());
  for (int64_t rows : {1, 8, 32, 64, 240}) {
    for (const Shape& sh : shapes) {
      const int64_t w_bytes = sh.in * sh.out * 2;
      const int copies = static_cast<int>(std::max<int64_t>(1, (int64_t{256} << 20) / w_bytes + 1));
      __nv_bfloat16* x = nullptr;
      std::vector<__nv_bfloat16*> w(copies, nullptr);
      void* y = nullptr;
      RETURN_IF_CUDA_ERROR(cudaMalloc(reinterpret_cast<void**>(&x), rows * sh.in * 2));
      RETURN_IF_CUDA_ERROR(cudaMalloc(&y, rows * sh.out * 4));
      RETURN_IF_ERROR(FillNormalBf16(x, rows * sh.in, 1, 0, 0, 1, nullptr));
      for (int k = 0; k < copies; ++k) {
        RETURN_IF_CUDA_ERROR(cudaMalloc(reinterpret_cast<void**>(&w[k]), w_bytes));
        RETURN_IF_ERROR(FillNormalBf16(w[k], sh.in * sh.out, 1, 1 + k, 0, 0.02f, nullptr));
      }
      // Mean time of 24 calls after one untimed call (cuBLASLt autotunes there); `run(r)` is
      // the r-th call.
      auto mean_us = [&](const std::function<absl::Status(int)>& run) -> absl::StatusOr<double> {
        RETURN_IF_ERROR(run(0));
        constexpr int kReps = 24;
        cudaEventRecord(start);
        for (int r = 0; r < kReps; ++r) RETURN_IF_ERROR(run(r + 1));
        cudaEventRecord(stop);
        RETURN_IF_CUDA_ERROR(cudaEventSynchronize(stop));
        float ms = 0;
        cudaEventElapsedTime(&ms, start, stop);
        return 1000.0 * ms / kReps;
      };
      auto time_us = [&](bool cold, CublasLtGemm* gemm) {
        return mean_us([&](int r) {
          return gemm->Linear(x, w[cold ? r % copies : 0], rows, sh.in, sh.out, y, sh.type, true,
                              nullptr);
        });
      };
      // The few-row wgmma kernel (kernels/cuda/skinny_wgmma_linear.h), same calls, same
      // weights, with its own choice of cut and with the best of every cut.
      double wgmma_cold = 0, best_cold = 0;
      std::string wgmma_cell = "-", best_cell = "-", best_cut;
      if (with_wgmma && SkinnyWgmmaLinearSupports(rows, sh.in, sh.out, x, w[0], y)) {
        auto wgmma_us = [&](SkinnyWgmmaConfig config) {
          return mean_us([&](int r) {
            return SkinnyWgmmaLinearCuda(x, w[r % copies], rows, sh.in, sh.out, y, sh.type, true,
                                         wgmma_ws, nullptr, config);
          });
        };
        auto cut = [&](SkinnyWgmmaConfig asked) {
          const SkinnyWgmmaConfig c = SkinnyWgmmaChosenConfig(rows, sh.in, sh.out, asked);
          return absl::StrCat(c.tile_features, "/", c.splits);
        };
        ASSIGN_OR_RETURN(wgmma_cold, wgmma_us({}));
        wgmma_cell = absl::StrCat(wgmma_cold, " (", cut({}), ")");
        // Every cut, to check the kernel's own choice against the best one.
        for (int features : {64, 128, 256}) {
          for (int splits : {1, 2, 3, 4, 6, 8}) {
            ASSIGN_OR_RETURN(const double us, wgmma_us({features, splits}));
            if (best_cold == 0 || us < best_cold) {
              best_cold = us;
              best_cut = cut({features, splits});
              best_cell = absl::StrCat(us, " (", best_cut, ")");
            }
          }
        }
      }
      ASSIGN_OR_RETURN(const double warm, time_us(false, tuned.get()));
      ASSIGN_OR_RETURN(const double cold, time_us(true, tuned.get()));
      double cublas_cold = cold;
      if (rows == 1) {
        ASSIGN_OR_RETURN(cublas_cold, time_us(true, cublas_only.get()));
      }
      const double tbs = w_bytes / (cold * 1e-6) / 1e12;
      std::cout << absl::StrCat("| ", rows, " | ", sh.name, " ", sh.in, "->", sh.out, " | ", warm,
                                " | ", cold, " | ", tbs, " | ", cublas_cold, " | ",
                                wgmma_cell, " | ", best_cell, " |\n");
      out["gemm"].push_back({{"rows", rows}, {"name", sh.name}, {"warm_us", warm},
                             {"cold_us", cold}, {"cold_weight_tbs", tbs},
                             {"cublaslt_cold_us", cublas_cold}, {"wgmma_cold_us", wgmma_cold},
                             {"wgmma_best_cold_us", best_cold}, {"wgmma_best_cut", best_cut}});
      cudaFree(x);
      for (auto* p : w) cudaFree(p);
      cudaFree(y);
    }
  }
  }
  if (!kernels) return absl::OkStatus();
  // The other launches of a decode step, one layer's worth each (plus the once-per-step ones).
  std::cout << "\n### Decode-step kernels besides the GEMMs (us per launch)\n\n"
            << "| rows | rms_norm (fp32 in) | rope_kv_append | decode attention (2K ctx) | swiglu | "
               "greedy argmax (vocab) | sampler, T 0.8 top-p 0.95 |\n|---|---|---|---|---|---|---|\n";
  for (int rows : {1, 32, 240}) {
    const int64_t Q = c.q_size(), KV = c.kv_size(), qkv_w = Q + 2 * KV;
    const int blocks_per_seq = 2048 / 16;
    DeviceRopeTable* rope_ptr = nullptr;
    ASSIGN_OR_RETURN(auto rope, DeviceRopeTable::Create(RopeTable(c.rope, 4096)));
    rope_ptr = rope.get();
    std::vector<void*> allocs;
    auto alloc = [&](int64_t bytes) -> void* {
      void* p = nullptr;
      if (cudaMalloc(&p, bytes) != cudaSuccess) return nullptr;
      cudaMemset(p, 0, bytes);
      allocs.push_back(p);
      return p;
    };
    auto* x = static_cast<__nv_bfloat16*>(alloc(rows * std::max(qkv_w, 2 * I) * 2));
    auto* y = static_cast<__nv_bfloat16*>(alloc(rows * std::max(qkv_w, 2 * I) * 2));
    auto* norm_w = static_cast<__nv_bfloat16*>(alloc(H * 2));
    const int64_t pool_blocks = int64_t{rows} * blocks_per_seq;
    auto* k_pool = static_cast<__nv_bfloat16*>(alloc(pool_blocks * KV * 16 * 2));
    auto* v_pool = static_cast<__nv_bfloat16*>(alloc(pool_blocks * KV * 16 * 2));
    std::vector<KvBlockEntry> tables(pool_blocks);
    for (int64_t b = 0; b < pool_blocks; ++b) tables[b] = PackKvBlockEntry(b, 0, 16);
    auto* d_tables = static_cast<KvBlockEntry*>(alloc(pool_blocks * 8));
    cudaMemcpy(d_tables, tables.data(), pool_blocks * 8, cudaMemcpyHostToDevice);
    std::vector<int32_t> nblocks(rows, blocks_per_seq), zeros(rows, 0);
    std::vector<int64_t> slots(rows);
    for (int r = 0; r < rows; ++r) slots[r] = int64_t{r} * blocks_per_seq * 16;
    auto* d_nblocks = static_cast<int32_t*>(alloc(rows * 4));
    auto* d_zeros = static_cast<int32_t*>(alloc(rows * 4));
    auto* d_slots = static_cast<int64_t*>(alloc(rows * 8));
    cudaMemcpy(d_nblocks, nblocks.data(), rows * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(d_slots, slots.data(), rows * 8, cudaMemcpyHostToDevice);
    auto* logits = static_cast<float*>(alloc(int64_t{rows} * c.vocab_size * 4));
    auto* params = static_cast<SamplingRowParams*>(alloc(rows * sizeof(SamplingRowParams)));
    auto* ids = static_cast<int32_t*>(alloc(rows * 4));
    ASSIGN_OR_RETURN(auto ws, PagedDecodeWorkspace::Create(0));
    auto time = [&](const std::function<absl::Status()>& f) -> absl::StatusOr<double> {
      RETURN_IF_ERROR(f());
      constexpr int kReps = 50;
      cudaEventRecord(start);
      for (int r = 0; r < kReps; ++r) RETURN_IF_ERROR(f());
      cudaEventRecord(stop);
      cudaEventSynchronize(stop);
      float ms = 0;
      cudaEventElapsedTime(&ms, start, stop);
      return 1000.0 * ms / kReps;
    };
    auto* residual = static_cast<float*>(alloc(rows * H * 4));
    ASSIGN_OR_RETURN(const double norm_us, time([&] {
      return RmsNormF32ToBf16Cuda(residual, norm_w, rows, static_cast<int>(H), 1e-5f, y, nullptr);
    }));
    ASSIGN_OR_RETURN(const double rope_us, time([&] {
      return RopeKvAppend({.q = x, .q_row_stride = qkv_w, .k = x + Q, .k_row_stride = qkv_w,
                           .v = x + Q + KV, .v_row_stride = qkv_w, .num_tokens = rows,
                           .num_heads = c.num_heads, .num_kv_heads = c.num_kv_heads,
                           .head_dim = c.head_dim, .local_positions = d_zeros,
                           .deltas = d_zeros, .slots = d_slots, .rope = rope_ptr->view(),
                           .q_out = y, .k_pool = k_pool, .v_pool = v_pool},
                          nullptr);
    }));
    ASSIGN_OR_RETURN(const double attn_us, time([&] {
      return PagedDecodeAttention({.q = x, .k_pool = k_pool, .v_pool = v_pool,
                                   .block_tables = d_tables, .num_blocks = d_nblocks,
                                   .batch = rows, .num_heads = c.num_heads,
                                   .num_kv_heads = c.num_kv_heads, .head_dim = c.head_dim,
                                   .max_blocks_per_seq = blocks_per_seq, .scale = 0.088f,
                                   .rotate = false, .rope = rope_ptr->view(), .out = y},
                                  *ws, nullptr);
    }));
    ASSIGN_OR_RETURN(const double swiglu_us,
                     time([&] { return SwiGluCuda(x, rows, I, y, nullptr); }));
    // Random logits (a softmax over a flat row is the sampler's slow case: top-p keeps most of
    // the vocabulary), T 0.8, top-p 0.95, a seed per row.
    {
      std::vector<float> host(int64_t{rows} * c.vocab_size);
      std::mt19937 rng(rows);
      std::normal_distribution<float> normal(0, 2);
      for (float& v : host) v = normal(rng);
      cudaMemcpy(logits, host.data(), host.size() * 4, cudaMemcpyHostToDevice);
      std::vector<SamplingRowParams> hp(rows);
      for (int r = 0; r < rows; ++r) {
        hp[r] = {.temperature = 0.8f, .top_p = 0.95f, .seed = uint64_t(r), .step = 3};
      }
      cudaMemcpy(params, hp.data(), rows * sizeof(SamplingRowParams), cudaMemcpyHostToDevice);
    }
    ASSIGN_OR_RETURN(const double sample_us, time([&] {
      return SampleRowsCuda({.logits = logits, .row_stride = c.vocab_size, .rows = rows,
                             .vocab = static_cast<int>(c.vocab_size), .params = params,
                             .out_ids = ids},
                            nullptr);
    }));
    auto* packed = static_cast<uint64_t*>(alloc(rows * 8));
    ASSIGN_OR_RETURN(const double argmax_us, time([&] {
      return GreedyArgmaxCuda(logits, c.vocab_size, rows, static_cast<int>(c.vocab_size), packed,
                              nullptr);
    }));
    std::cout << absl::StrCat("| ", rows, " | ", norm_us, " | ", rope_us, " | ", attn_us, " | ",
                              swiglu_us, " | ", argmax_us, " | ", sample_us, " |\n");
    out["kernels"].push_back({{"rows", rows}, {"rms_norm_us", norm_us},
                              {"rope_kv_append_us", rope_us}, {"decode_attention_2k_us", attn_us},
                              {"swiglu_us", swiglu_us}, {"greedy_argmax_us", argmax_us},
                              {"sampler_top_p_us", sample_us}});
    for (void* p : allocs) cudaFree(p);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  CliArgs args;
  args.Declare("shape", CliArgs::Kind::kValue, "random model shape (default llama3-8b)");
  args.Declare("parts", CliArgs::Kind::kValue,
               "gemm,kernels,ttft,decode,serving (default all)");
  args.Declare("kv-budget-gib", CliArgs::Kind::kValue, "KV budget for ttft/decode (default 64)");
  args.Declare("batches", CliArgs::Kind::kValue,
               "decode batches at 2K context; 0 = the largest that fits (default 32,0)");
  args.Declare("serving-requests", CliArgs::Kind::kValue, "requests per trace (default 60)");
  args.Declare("serving-rates", CliArgs::Kind::kValue, "arrival rates, req/s (default 2,6)");
  args.Declare("serving-kv-gib", CliArgs::Kind::kValue, "KV budget of the trace (default 12)");
  args.Declare("profile-decode-steps", CliArgs::Kind::kValue,
               "steady decode steps inside cudaProfilerStart/Stop, per decode run (default 0)");
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
               "runner: prefill attention kernel, mma or wgmma (default the runner's)");
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
  b.fused_norms = !args.Has("no-fused-norms");
  b.fused_qkv_rope = args.Has("fused-qkv-rope");
  b.wgmma_packed_weights = !args.Has("no-wgmma-packed");
  b.early_decode_kv_loads = !args.Has("no-early-kv-loads");
  b.pipeline_decode = !args.Has("no-pipeline-decode");
  if (args.Has("prefill-kernel")) {
    const std::string k = args.String("prefill-kernel");
    if (k != "mma" && k != "wgmma") {
      std::cerr << "--prefill-kernel: mma or wgmma, not " << k << "\n";
      return 2;
    }
    b.prefill_kernel = k == "wgmma" ? PrefillKernel::kWgmma : PrefillKernel::kMmaSync;
  }
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
  const std::string parts = args.String("parts", "gemm,kernels,ttft,decode,serving");
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
  if (status.ok() && parts.find("decode") != std::string::npos) {
    status = RunDecode(b, budget, batches,
                       static_cast<int>(args.Int("profile-decode-steps", 0).value_or(0)), out);
  }
  if (status.ok() && parts.find("serving") != std::string::npos) {
    status = RunServing(b, args.Int("serving-kv-gib", 12).value_or(12) * gib,
                        static_cast<int>(args.Int("serving-requests", 60).value_or(60)), rates, out);
  }
  std::cout << out.dump() << "\n";
  if (!status.ok()) {
    std::cerr << "lazyattn-bench-engine: " << status.message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace lazyattn

int main(int argc, char** argv) { return lazyattn::Main(argc, argv); }
