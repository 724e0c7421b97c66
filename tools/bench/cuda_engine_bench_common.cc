// Shared pieces of lazyattn-bench-engine: tools/bench/cuda_engine_bench.h.
#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tools/bench/cuda_engine_bench.h"

namespace lazyattn::engine_bench {

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(std::ceil(p * v.size())) - 1);
  return v[i];
}

std::vector<int32_t> DocumentTokens(int id, int length) {
  std::mt19937 rng(1000003u * static_cast<uint32_t>(id) + 17);
  std::vector<int32_t> t(length);
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % 250);
  return t;
}

EngineRequest RagRequest(const std::vector<int>& docs, int doc_tokens, int question_id,
                         CacheMode mode, int max_tokens) {
  EngineRequest r{.mode = mode, .sampling = {.max_tokens = max_tokens, .ignore_eos = true}};
  for (int d : docs) {
    r.documents.push_back({.id = absl::StrCat("doc", d), .token_ids = DocumentTokens(d, doc_tokens)});
  }
  r.question_token_ids = DocumentTokens(-1 - question_id, 64);
  return r;
}

TraceResult RunTrace(Engine& engine, const std::vector<EngineRequest>& requests,
                     const std::vector<double>& arrival,
                     std::function<void()> on_all_started,
                     std::function<void()> on_token_after_start,
                     std::function<void()> on_first_done) {
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

}  // namespace lazyattn::engine_bench
