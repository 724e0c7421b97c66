// lazyattn-bench-engine's serving parts (tools/bench/cuda_engine_bench.h): RAG requests over a
// pool of documents drawn Zipf or uniform, replayed identically in modes prefix, block and lazy.
// `serving` is open loop (Poisson arrivals at given rates); `saturation` is closed loop (N clients,
// each sending its next request when its last one finishes), with a KV budget that forces
// eviction, which is where the modes' different cache footprints decide throughput.
#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <iostream>
#include <mutex>
#include <numeric>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tools/bench/cuda_engine_bench.h"

namespace lazyattn::engine_bench {
namespace {

struct Trace {
  std::vector<std::vector<int>> docs;  // per request, distinct documents of the pool
  std::vector<double> arrival;         // seconds from the start (open loop only)
};

// `zipf` 0 draws documents uniformly, s > 0 with weight (rank + 1)^-s. With `rate` > 0 Poisson
// arrival gaps are drawn too, interleaved with the documents (the order the published open-loop
// traces were drawn in, so they stay the same traces).
Trace DrawTrace(int num_requests, int pool, int docs_per_request, double zipf, double rate) {
  std::mt19937_64 rng(42);
  std::vector<double> weight(pool);
  for (int i = 0; i < pool; ++i) weight[i] = zipf == 0 ? 1.0 : std::pow(i + 1.0, -zipf);
  std::discrete_distribution<int> pick(weight.begin(), weight.end());
  std::exponential_distribution<double> gap(rate > 0 ? rate : 1.0);
  Trace t{.docs = std::vector<std::vector<int>>(num_requests),
          .arrival = std::vector<double>(num_requests)};
  double at = 0;
  for (int i = 0; i < num_requests; ++i) {
    while (static_cast<int>(t.docs[i].size()) < docs_per_request) {
      const int d = pick(rng);
      if (std::find(t.docs[i].begin(), t.docs[i].end(), d) == t.docs[i].end()) {
        t.docs[i].push_back(d);
      }
    }
    t.arrival[i] = at;
    if (rate > 0) at += gap(rng);
  }
  return t;
}

struct ClosedLoopResult {
  std::vector<RequestResult> results;
  absl::Time start, end;
  int failures = 0;
};

// Runs `requests` in order with at most `clients` in flight: each completion submits the next.
// Submissions happen on this thread (never inside the engine's callbacks).
ClosedLoopResult RunClosedLoop(Engine& engine, const std::vector<EngineRequest>& requests,
                               int clients) {
  ClosedLoopResult r;
  r.results.resize(requests.size());
  std::mutex mu;
  std::condition_variable cv;
  int in_flight = 0;
  size_t done = 0;
  r.start = absl::Now();
  for (size_t next = 0; next < requests.size(); ++next) {
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return in_flight < clients; });
      ++in_flight;
    }
    RequestCallbacks cb;
    cb.on_done = [&, next](const absl::Status& s, const RequestResult& result) {
      std::lock_guard<std::mutex> lock(mu);
      if (!s.ok()) ++r.failures;
      r.results[next] = result;
      --in_flight;
      ++done;
      cv.notify_all();
    };
    if (!engine.Submit(requests[next], std::move(cb)).ok()) {
      std::lock_guard<std::mutex> lock(mu);
      ++r.failures;
      --in_flight;
      ++done;
    }
  }
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done == requests.size(); });
  r.end = absl::Now();
  return r;
}

}  // namespace

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
      const Trace trace = DrawTrace(num_requests, kPool, kDocsPerRequest,
                                    std::string(dist) == "uniform" ? 0.0 : 2.1, rate);
      const std::vector<std::vector<int>>& docs = trace.docs;
      const std::vector<double>& arrival = trace.arrival;
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

// --- Saturation: closed loop, Zipf 1.1 / 1.5 / 2.1, eviction forced by the KV budget. ---
absl::Status RunSaturation(Bench& b, int64_t kv_budget, int num_requests, int clients, json& out) {
  constexpr int kPool = 120, kDocTokens = 2048, kDocsPerRequest = 5, kOutput = 32;
  std::cout << "\n### Saturation (closed loop: " << clients << " clients, " << kPool
            << " documents x " << kDocTokens << " tokens, " << kDocsPerRequest << " per request, "
            << kOutput << " output tokens, " << num_requests << " requests, KV budget "
            << (kv_budget >> 30) << " GiB)\n\n"
            << "| zipf | mode | doc hit ratio | req/s | output tok/s | TTFT mean ms | TTFT p50 ms | "
               "TTFT p99 ms |\n|---|---|---|---|---|---|---|---|\n";
  for (double zipf : {1.1, 1.5, 2.1}) {
    const Trace trace = DrawTrace(num_requests, kPool, kDocsPerRequest, zipf, /*rate=*/0);
    for (CacheMode mode : {CacheMode::kPrefix, CacheMode::kBlock, CacheMode::kLazy}) {
      ASSIGN_OR_RETURN(auto engine, b.MakeEngine(kv_budget, 64));
      // Warm-up on documents outside the pool (cuBLAS plans, first launches).
      RETURN_IF_ERROR(engine->Run(RagRequest({900, 901, 902, 903, 904}, kDocTokens, 0, mode, 4))
                          .status());
      std::vector<EngineRequest> reqs;
      for (int i = 0; i < num_requests; ++i) {
        reqs.push_back(RagRequest(trace.docs[i], kDocTokens, i, mode, kOutput));
      }
      const ClosedLoopResult t = RunClosedLoop(*engine, reqs, clients);
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
      const double ttft_mean = std::accumulate(ttft.begin(), ttft.end(), 0.0) / ttft.size();
      const std::string name(CacheModeName(mode));
      std::cout << absl::StrCat("| ", zipf, " | ", name, " | ", hit_ratio, " | ",
                                num_requests / seconds, " | ", out_tokens / seconds, " | ",
                                ttft_mean, " | ", Percentile(ttft, 0.5), " | ",
                                Percentile(ttft, 0.99), " |", t.failures ? " failures!" : "", "\n");
      out["saturation"].push_back({{"zipf", zipf},
                                   {"mode", name},
                                   {"clients", clients},
                                   {"doc_hit_ratio", hit_ratio},
                                   {"req_s", num_requests / seconds},
                                   {"out_tok_s", out_tokens / seconds},
                                   {"ttft_mean_ms", ttft_mean},
                                   {"ttft_p50_ms", Percentile(ttft, 0.5)},
                                   {"ttft_p99_ms", Percentile(ttft, 0.99)},
                                   {"failures", t.failures}});
      if (t.failures > 0) return absl::InternalError(absl::StrCat(t.failures, " requests failed"));
    }
  }
  return absl::OkStatus();
}

}  // namespace lazyattn::engine_bench
