// `lazyattn trace`: a serving trace against a cluster's router. RAG requests over a pool of
// documents (token ids, distinct per document), drawn Zipf or uniform, arrive as a Poisson process;
// each runs on its own thread from its arrival time. Reports, from the client's side, TTFT and
// request latency p50/p99 (latency in the JSON line), request and output-token throughput, and
// the document hit ratio and per-worker spread from the servers' Final messages. One markdown row
// and one JSON line on stdout.
//
//   lazyattn trace --router HOST:PORT [--requests 60] [--rate 4] [--dist zipf:2.1|uniform]
//                  [--pool 120] [--doc-tokens 2048] [--docs-per-request 5] [--vocab 250]
//                  [--max-tokens 32] [--mode lazy] [--seed 42] [--timeout 600] [--label TEXT]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"
#include "lazyattn/v1/inference.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tools/cli/cli_args.h"
#include "tools/cli/client_common.h"
#include "tools/cli/commands.h"
#include "tools/cli/router_channel.h"

namespace lazyattn {
namespace {

using Clock = std::chrono::steady_clock;

struct Outcome {
  bool ok = false;
  std::string error;
  double ttft_ms = 0;     // client side: send to first streamed token
  double latency_ms = 0;  // send to end of stream
  int64_t tokens = 0, documents = 0, documents_hit = 0;
  // The router's predicted document hit tokens for the serving worker, and what it reused.
  int64_t predicted_hit_tokens = 0, observed_hit_tokens = 0;
  std::string worker;
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(std::ceil(p * v.size())) - 1)];
}

}  // namespace

int TraceCommand(int argc, char** argv) {
  CliArgs args;
  args.Declare("router", CliArgs::Kind::kValue, "the router's HOST:PORT");
  DeclareRouterSecurityFlags(args);
  args.Declare("requests", CliArgs::Kind::kValue, "requests in the trace (default 60)");
  args.Declare("rate", CliArgs::Kind::kValue, "mean arrivals per second (default 4)");
  args.Declare("dist", CliArgs::Kind::kValue, "document popularity: zipf:A or uniform");
  args.Declare("pool", CliArgs::Kind::kValue, "documents in the pool (default 120)");
  args.Declare("doc-tokens", CliArgs::Kind::kValue, "tokens per document (default 2048)");
  args.Declare("docs-per-request", CliArgs::Kind::kValue, "documents per request (default 5)");
  args.Declare("vocab", CliArgs::Kind::kValue, "document token ids are below this (default 250)");
  args.Declare("max-tokens", CliArgs::Kind::kValue, "output tokens per request (default 32)");
  args.Declare("mode", CliArgs::Kind::kValue, "cache mode (default lazy)");
  args.Declare("seed", CliArgs::Kind::kValue, "trace seed (default 42)");
  args.Declare("timeout", CliArgs::Kind::kValue, "per-request deadline in seconds (default 600)");
  args.Declare("label", CliArgs::Kind::kValue, "first column of the table row");
  if (absl::Status s = args.Parse(argc, argv, 2); !s.ok() || !args.Has("router")) {
    std::cerr << "lazyattn trace: --router is required\n" << args.Help();
    return 2;
  }
  const int requests = static_cast<int>(args.Int("requests", 60).value_or(60));
  const double rate = args.Double("rate", 4).value_or(4);
  const int pool = static_cast<int>(args.Int("pool", 120).value_or(120));
  const int doc_tokens = static_cast<int>(args.Int("doc-tokens", 2048).value_or(2048));
  const int per_request = static_cast<int>(args.Int("docs-per-request", 5).value_or(5));
  const int vocab = static_cast<int>(args.Int("vocab", 250).value_or(250));
  const int max_tokens = static_cast<int>(args.Int("max-tokens", 32).value_or(32));
  const uint64_t seed = static_cast<uint64_t>(args.Int("seed", 42).value_or(42));
  const double timeout = args.Double("timeout", 600).value_or(600);
  const std::string dist = args.String("dist", "zipf:2.1");
  auto mode = ParseCacheMode(args.String("mode", "lazy"));
  if (!mode.ok()) return CliFail(mode.status(), 2);
  if (requests < 1 || !(rate > 0) || pool < per_request || per_request < 1 || doc_tokens < 1 ||
      vocab < 1 || max_tokens < 1) {
    return CliFail(absl::InvalidArgumentError(
                       "trace: requests, rate, doc-tokens, vocab, max-tokens must be positive and "
                       "pool >= docs-per-request >= 1"),
                   2);
  }
  double zipf_a = 0;
  if (dist.rfind("zipf:", 0) == 0) {
    zipf_a = std::atof(dist.c_str() + 5);
    if (!(zipf_a > 0)) return CliFail(absl::InvalidArgumentError("--dist zipf:A needs A > 0"), 2);
  } else if (dist != "uniform") {
    return CliFail(absl::InvalidArgumentError("--dist is zipf:A or uniform"), 2);
  }

  // The trace: documents and arrival times, fixed by the seed.
  std::mt19937_64 rng(seed);
  std::vector<double> weight(pool);
  for (int i = 0; i < pool; ++i) weight[i] = zipf_a > 0 ? std::pow(i + 1.0, -zipf_a) : 1.0;
  std::discrete_distribution<int> pick(weight.begin(), weight.end());
  std::exponential_distribution<double> gap(rate);
  std::vector<v1::GenerateRequest> trace(requests);
  std::vector<double> arrival(requests);
  double at = 0;
  for (int r = 0; r < requests; ++r) {
    std::vector<int> docs;
    while (static_cast<int>(docs.size()) < per_request) {
      const int d = pick(rng);
      if (std::find(docs.begin(), docs.end(), d) == docs.end()) docs.push_back(d);
    }
    v1::GenerateRequest& q = trace[r];
    for (int d : docs) {
      v1::Document* doc = q.add_documents();
      doc->set_id(absl::StrCat("doc-", d));
      std::mt19937 doc_rng(1000003u * static_cast<uint32_t>(d) + 17);
      for (int t = 0; t < doc_tokens; ++t) {
        doc->mutable_tokens()->add_ids(static_cast<int32_t>(doc_rng() % vocab));
      }
    }
    q.set_question(absl::StrCat(" Question ", r, ": what do these documents say?"));
    q.set_cache_mode(ToProtoMode(*mode));
    q.mutable_sampling()->set_max_tokens(max_tokens);
    q.mutable_sampling()->set_ignore_eos(true);
    arrival[r] = at;
    at += gap(rng);
  }

  auto channel = MakeRouterChannel(args, args.String("router"));
  if (!channel.ok()) return CliFail(channel.status());
  auto stub = v1::Inference::NewStub(*channel);
  std::vector<Outcome> outcomes(requests);
  std::vector<std::thread> threads;
  const auto start = Clock::now();
  for (int r = 0; r < requests; ++r) {
    std::this_thread::sleep_until(start + std::chrono::duration<double>(arrival[r]));
    threads.emplace_back([&, r] {
      Outcome& o = outcomes[r];
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::milliseconds(static_cast<int64_t>(timeout * 1000)));
      const auto sent = Clock::now();
      auto reader = stub->Generate(&context, trace[r]);
      v1::GenerateResponse response;
      while (reader->Read(&response)) {
        if (response.has_token()) {
          if (o.tokens++ == 0) {
            o.ttft_ms = std::chrono::duration<double, std::milli>(Clock::now() - sent).count();
          }
        } else if (response.has_final()) {
          o.documents = response.final().usage().documents();
          o.documents_hit = response.final().usage().documents_hit();
          o.worker = response.final().worker();
          o.predicted_hit_tokens = response.final().predicted_hit_tokens();
          o.observed_hit_tokens = response.final().usage().document_hit_tokens();
        }
      }
      const grpc::Status status = reader->Finish();
      o.latency_ms = std::chrono::duration<double, std::milli>(Clock::now() - sent).count();
      o.ok = status.ok();
      if (!status.ok()) o.error = status.error_message();
    });
  }
  for (std::thread& t : threads) t.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();

  std::vector<double> ttft, latency;
  int64_t ok = 0, tokens = 0, documents = 0, hits = 0;
  std::map<std::string, int> per_worker;
  std::string first_error;
  // Per request (in trace order, succeeded ones): predicted vs observed hit tokens; within 5 %
  // when |predicted - observed| <= 5 % of the larger (both 0 counts as exact).
  nlohmann::json predicted_hits = nlohmann::json::array(), observed_hits = nlohmann::json::array();
  int64_t within_5pct = 0;
  for (const Outcome& o : outcomes) {
    if (!o.ok) {
      if (first_error.empty()) first_error = o.error;
      continue;
    }
    ++ok;
    predicted_hits.push_back(o.predicted_hit_tokens);
    observed_hits.push_back(o.observed_hit_tokens);
    const int64_t larger = std::max(o.predicted_hit_tokens, o.observed_hit_tokens);
    if (20 * std::abs(o.predicted_hit_tokens - o.observed_hit_tokens) <= larger) ++within_5pct;
    ttft.push_back(o.ttft_ms);
    latency.push_back(o.latency_ms);
    tokens += o.tokens;
    documents += o.documents;
    hits += o.documents_hit;
    ++per_worker[o.worker];
  }
  const double hit_ratio = documents > 0 ? static_cast<double>(hits) / documents : 0;
  std::string spread;
  for (const auto& [worker, n] : per_worker) absl::StrAppend(&spread, spread.empty() ? "" : " ", n);
  std::cout << absl::StrCat("| ", args.String("label", "trace"), " | ", dist, " | ", rate, " | ",
                            CacheModeName(*mode).data(), " | ", hit_ratio, " | ",
                            Percentile(ttft, 0.5), " | ", Percentile(ttft, 0.99), " | ",
                            ok / seconds, " | ", tokens / seconds, " | ", spread, " | ",
                            requests - ok, " |\n");
  nlohmann::json out = {{"label", args.String("label", "trace")},
                        {"dist", dist},
                        {"rate", rate},
                        {"mode", std::string(CacheModeName(*mode))},
                        {"requests", requests},
                        {"failed", requests - ok},
                        {"doc_hit_ratio", hit_ratio},
                        {"ttft_p50_ms", Percentile(ttft, 0.5)},
                        {"ttft_p99_ms", Percentile(ttft, 0.99)},
                        {"latency_p50_ms", Percentile(latency, 0.5)},
                        {"latency_p99_ms", Percentile(latency, 0.99)},
                        {"req_s", ok / seconds},
                        {"out_tok_s", tokens / seconds},
                        {"per_worker", per_worker},
                        {"predicted_hit_tokens", predicted_hits},
                        {"observed_hit_tokens", observed_hits},
                        {"prediction_within_5pct",
                         ok > 0 ? static_cast<double>(within_5pct) / ok : 0}};
  if (!first_error.empty()) out["first_error"] = first_error;
  std::cout << out.dump() << "\n";
  return ok == requests ? 0 : 1;
}

}  // namespace lazyattn
