// lazyattn-bench-engine's request-level parts: RAG TTFT per cache mode, and decode step time and
// batch throughput (tools/bench/cuda_engine_bench.h).
#include <algorithm>
#include <cmath>
#include <iostream>
#include <numeric>
#include <optional>
#include <random>
#include <string>

#include <cuda_profiler_api.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tools/bench/cuda_engine_bench.h"

namespace lazyattn::engine_bench {

// --- TTFT of a 5 x 4,096-token RAG request: cold, 3 of 5 cached, all cached, per mode. ---
absl::Status RunTtft(Bench& b, int64_t kv_budget, json& out) {
  std::cout << "\n### RAG TTFT (5 documents x 4,096 tokens + 64-token question, 128 output "
               "tokens; documents reordered between requests)\n\n"
            << "| mode | cold ms | 3 of 5 cached ms | all cached ms | decode tok/s | "
               "all cached, its step: GPU / Forward / launch ms |\n|---|---|---|---|---|---|\n";
  constexpr int kRepeats = 3;
  std::string cold_profile;   // printed after the table
  std::string step_profiles;  // likewise
  for (CacheMode mode : b.ttft_modes) {
    ASSIGN_OR_RETURN(auto engine, b.MakeEngine(kv_budget, 64));
    // Warm-up (cuBLAS plans, first-touch allocations) on documents used nowhere else.
    RETURN_IF_ERROR(engine->Run(RagRequest({900, 901, 902, 903, 904}, 4096, 0, mode, 8)).status());
    std::vector<double> cold, partial, warm, decode, step_gpu, step_wall, step_launch;
    std::vector<double> profiled_ttft, step_prep;  // the one-token request whose step is timed
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
      const bool profiled = b.profile_ttft_step && mode == CacheMode::kLazy && rep == kRepeats - 1;
      if (profiled) cudaProfilerStart();
      auto r4 = engine->Run(RagRequest({base + 2, base + 5, base + 1, base + 4, base + 3}, 4096,
                                       q + 3, mode, 1));
      if (profiled) cudaProfilerStop();
      RETURN_IF_ERROR(r4.status());
      const CudaModelRunner::StepProfile prof = b.runner->profile();
      b.runner->set_profiling(false);
      step_gpu.push_back(prof.steps ? prof.gpu_ms / prof.steps : 0);
      step_wall.push_back(prof.steps ? prof.forward_wall_ms / prof.steps : 0);
      step_launch.push_back(prof.steps ? prof.enqueue_ms / prof.steps : 0);
      step_prep.push_back(prof.steps ? prof.prep_ms / prof.steps : 0);
      profiled_ttft.push_back(r4->ttft_ms);
    }
    if (mode == CacheMode::kLazy) {
      // Where a cold TTFT goes: one more request on documents no request has used (ids 950+),
      // one output token, with the runner's step profile on (and, with --profile-cold-step,
      // inside cudaProfilerStart/Stop for ncu).
      b.runner->set_profiling(true);
      if (b.profile_cold_step) cudaProfilerStart();
      auto cold_run = engine->Run(RagRequest({950, 951, 952, 953, 954}, 4096, 99, mode, 1));
      if (b.profile_cold_step) cudaProfilerStop();
      RETURN_IF_ERROR(cold_run.status());
      const CudaModelRunner::StepProfile prof = b.runner->profile();
      b.runner->set_profiling(false);
      cold_profile = absl::StrCat(
          "\nCold lazy request, step profile on: TTFT ", cold_run->ttft_ms, " ms; ", prof.steps,
          " steps: GPU ", prof.gpu_ms, " ms, runner wall ", prof.forward_wall_ms,
          " ms (host prep ", prof.prep_ms, ", enqueue ", prof.enqueue_ms,
          "), engine between steps ", prof.between_ms, " ms\n");
      out["ttft"]["lazy_cold_profile"] = {{"ttft_ms", cold_run->ttft_ms},
                                          {"steps", prof.steps},
                                          {"gpu_ms", prof.gpu_ms},
                                          {"runner_wall_ms", prof.forward_wall_ms},
                                          {"host_prep_ms", prof.prep_ms},
                                          {"enqueue_ms", prof.enqueue_ms},
                                          {"between_ms", prof.between_ms}};
    }
    const auto med = [](std::vector<double> v) { return Percentile(std::move(v), 0.5); };
    // The timed step's request alone: its TTFT against its step's Forward is the host time
    // around the step (the engine, the first token's way out), medians of the repeats.
    step_profiles += absl::StrCat(
        "\nAll-cached ", std::string(CacheModeName(mode)),
        " request, 1 output token, step profile on: TTFT ", med(profiled_ttft),
        " ms; its step: Forward ", med(step_wall), " ms (host prep ", med(step_prep),
        ", enqueue ", med(step_launch), "), GPU ", med(step_gpu), " ms\n");
    std::cout << absl::StrCat("| ", std::string(CacheModeName(mode)), " | ", med(cold), " | ", med(partial),
                              " | ", med(warm), " | ", med(decode), " | ", med(step_gpu), " / ",
                              med(step_wall), " / ", med(step_launch), " |\n");
    out["ttft"][std::string(CacheModeName(mode))] = {{"cold_ms", med(cold)},
                                                    {"three_cached_ms", med(partial)},
                                                    {"all_cached_ms", med(warm)},
                                                    {"decode_tok_s", med(decode)},
                                                    {"all_cached_step_gpu_ms", med(step_gpu)},
                                                    {"all_cached_step_forward_ms", med(step_wall)},
                                                    {"all_cached_step_launch_ms", med(step_launch)},
                                                    {"all_cached_step_prep_ms", med(step_prep)},
                                                    {"all_cached_profiled_ttft_ms",
                                                     med(profiled_ttft)}};
  }
  std::cout << step_profiles << cold_profile;
  return absl::OkStatus();
}

// --- Decode: batch 1 at 20K context, batch 32 at 2K, and the largest batch that fits. ---
absl::Status RunDecode(Bench& b, int64_t kv_budget, const std::vector<int>& batches,
                       int profile_steps, bool top_logprobs, int logit_bias, json& out) {
  std::cout << "\n### Decode\n\n| batch | context | sampling | step ms | output tok/s | GPU ms/step | "
               "runner wall ms/step | host prep ms/step | launch ms/step | "
               "engine ms between steps | CUDA graph replays |\n"
               "|---|---|---|---|---|---|---|---|---|---|---|\n";
  ASSIGN_OR_RETURN(auto engine, b.MakeEngine(kv_budget, 512));
  // `sampled`: temperature 0.8, top-p 0.95, a seed per request (the sampled decode row);
  // `top_rows`: the first top_rows requests also ask for logprobs with 5 alternatives;
  // `bias_entries`: every request has a logit bias of that many entries (small, spread biases
  // that steer nothing much: what is timed is their cost).
  auto one = [&](int batch, int context, int steps, bool sampled, int top_rows = 0,
                 int bias_entries = 0) -> absl::Status {
    std::vector<EngineRequest> reqs;
    for (int i = 0; i < batch; ++i) {
      EngineRequest r{.mode = CacheMode::kFull,
                      .sampling = {.max_tokens = steps, .ignore_eos = true}};
      if (sampled) {
        r.sampling.temperature = 0.8f;
        r.sampling.top_p = 0.95f;
        r.sampling.seed = 7 + i;
      }
      if (i < top_rows) {
        r.sampling.logprobs = true;
        r.sampling.top_logprobs = 5;
      }
      for (int k = 0; k < bias_entries; ++k) {
        const int32_t id = static_cast<int32_t>((int64_t{k} * 7919 + i) % b.config.vocab_size);
        r.sampling.logit_bias.push_back({id, k % 2 == 0 ? 0.5f : -0.5f});
      }
      std::sort(r.sampling.logit_bias.begin(), r.sampling.logit_bias.end(),
                [](const LogitBias& x, const LogitBias& y) { return x.id < y.id; });
      r.sampling.logit_bias.erase(
          std::unique(r.sampling.logit_bias.begin(), r.sampling.logit_bias.end(),
                      [](const LogitBias& x, const LogitBias& y) { return x.id == y.id; }),
          r.sampling.logit_bias.end());
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
    std::string label = sampled ? "T 0.8 top-p 0.95" : "greedy";
    std::string key = sampled ? "t0.8_p0.95" : "greedy";
    if (top_rows > 0) {
      absl::StrAppend(&label, ", top_logprobs 5 on ", top_rows, " of ", batch);
      absl::StrAppend(&key, "_top5_", top_rows);
    }
    if (bias_entries > 0) {
      absl::StrAppend(&label, ", logit_bias of ", bias_entries, " on every request");
      absl::StrAppend(&key, "_bias", bias_entries);
    }
    std::cout << absl::StrCat("| ", batch, " | ", context, " | ", label, " | ", step_ms, " | ",
                              tok_s, " | ", gpu_ms, " | ", wall_ms, " | ", prep_ms, " | ",
                              launch_ms - prep_ms, " | ", between_ms, " | ", replays, " |\n");
    out["decode"].push_back({{"batch", batch},
                             {"context", context},
                             {"sampling", key},
                             {"step_ms", step_ms},
                             {"tok_s", tok_s},
                             {"gpu_ms", gpu_ms},
                             {"runner_wall_ms", wall_ms},
                             {"host_prep_ms", prep_ms},
                             {"launch_ms", launch_ms - prep_ms},
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
    if (top_logprobs) {
      RETURN_IF_ERROR(one(batch, 2048, 128, true, 1));
      RETURN_IF_ERROR(one(batch, 2048, 128, true, batch));
    }
    if (logit_bias > 0) {
      for (bool sampled : {false, true}) {
        RETURN_IF_ERROR(one(batch, 2048, 128, sampled, 0, logit_bias));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace lazyattn::engine_bench
