// A kvdir restart as routers see it, through gRPC: a kvdir server (insecure, in this process) and
// N workers that each say hello and send one full snapshot at once, while a router looks 5
// documents up every millisecond with the router's 50 ms deadline, on the default 3 s lease with
// the workers heartbeating. Prints the snapshots applied, the streams that stayed whole (a lease
// that passed would end one), the lookups that missed their deadline and the latency percentiles
// until every snapshot is applied, as a Markdown row and a JSON line.
// (tools/bench/kvdir_index_bench.cc measures the index alone.)
//
//   lazyattn-bench-kvdir-storm [--workers 8] [--entries 262144]
#include <grpcpp/grpcpp.h>
#include <prometheus/metric_family.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <iostream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"
#include "lazyattn/v1/kvdir.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "services/kvdir/server/kvdir_server.h"
#include "tools/cli/cli_args.h"

namespace lazyattn::kvdir {
namespace {

constexpr int kLeaseMs = 3000;  // the default lease_ms

v1::DocKey KeyOf(int worker, int64_t i) {
  v1::DocKey k;
  k.set_hi(static_cast<uint64_t>(worker) << 40 | static_cast<uint64_t>(i));
  k.set_lo(~static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull);
  return k;
}

// Hello as worker-`w`, then `snapshot` (made beforehand, so the storm times kvdir, not this), then
// heartbeats every lease / 3 as a worker sends them until `stop`. Whether the stream stayed
// whole (an expired lease ends it ABORTED).
bool Publish(const std::string& address, int w, const v1::WorkerMessage& snapshot,
             const std::atomic<bool>& stop) {
  auto channel = MakeChannel(address, TlsOptions{}, 64 << 20);
  if (!channel.ok()) std::abort();
  auto stub = v1::KvDirectory::NewStub(*channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  auto stream = stub->Publish(&ctx);
  v1::WorkerMessage hello;
  hello.set_seq(1);
  hello.mutable_hello()->mutable_status()->set_worker_id(absl::StrCat("worker-", w));
  hello.mutable_hello()->mutable_status()->set_address(absl::StrCat("127.0.0.1:", 1 + w));
  hello.mutable_hello()->set_epoch(1);
  v1::DirectoryMessage reply;
  bool whole = stream->Write(hello) && stream->Read(&reply) && stream->Read(&reply) &&
               stream->Write(snapshot);
  for (uint64_t seq = 3; whole && !stop; ++seq) {
    std::this_thread::sleep_for(std::chrono::milliseconds(kLeaseMs / 3));
    v1::WorkerMessage heartbeat;
    heartbeat.set_seq(seq);
    heartbeat.mutable_heartbeat();
    whole = stream->Write(heartbeat);
  }
  stream->WritesDone();
  while (stream->Read(&reply)) {
  }
  const grpc::Status status = stream->Finish();
  if (!whole || !status.ok()) {
    std::cerr << "worker-" << w << ": the stream ended " << status.error_code() << " "
              << status.error_message() << "\n";
    return false;
  }
  return true;
}

double Counter(KvdirServer& server, const std::string& name, const std::string& label) {
  for (const prometheus::MetricFamily& f : server.registry()->Collect()) {
    if (f.name != name) continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      for (const prometheus::ClientMetric::Label& l : m.label) {
        if (l.value == label) return m.counter.value;
      }
    }
  }
  return -1;
}

int Main(int argc, char** argv) {
  CliArgs args;
  args.Declare("workers", CliArgs::Kind::kValue, "workers snapshotting at once (default 8)");
  args.Declare("entries", CliArgs::Kind::kValue, "entries in each snapshot (default 262144)");
  if (absl::Status s = args.Parse(argc, argv, 1); !s.ok()) {
    std::cerr << s.message() << "\n" << args.Help();
    return 2;
  }
  const int workers = static_cast<int>(args.Int("workers", 8).value_or(8));
  const int64_t entries = args.Int("entries", 262144).value_or(262144);
  if (workers < 1 || workers > 64 || entries < 1 || entries > 262144) {
    std::cerr << "--workers 1..64, --entries 1..262144\n";
    return 2;
  }
  KvdirOptions options;
  options.listen_address = "127.0.0.1:0";
  options.metrics_address = "";
  options.lease_ms = kLeaseMs;
  auto server = KvdirServer::Create(options);
  if (!server.ok()) {
    std::cerr << server.status() << "\n";
    return 1;
  }
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());
  std::vector<v1::WorkerMessage> snapshots(workers);
  for (int w = 0; w < workers; ++w) {
    snapshots[w].set_seq(2);
    auto* list = snapshots[w].mutable_snapshot()->mutable_entries();
    list->Reserve(static_cast<int>(entries));
    for (int64_t i = 0; i < entries; ++i) {
      v1::DocEntry* e = list->Add();
      *e->mutable_key() = KeyOf(w, i);
      e->set_tokens(512);
      e->set_offset(-1);
    }
  }
  std::atomic<bool> storm{false}, done{false};
  std::vector<double> ms;
  int64_t missed = 0;
  std::thread router([&] {
    auto channel = MakeChannel(address, TlsOptions{});
    if (!channel.ok()) std::abort();
    auto stub = v1::KvDirectory::NewStub(*channel);
    while (!done) {
      v1::LookupRequest request;
      for (int k = 0; k < 5; ++k) *request.add_keys() = KeyOf(0, k);
      v1::LookupResponse response;
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(50));
      const auto t0 = std::chrono::steady_clock::now();
      const grpc::Status s = stub->Lookup(&ctx, request, &response);
      const auto t1 = std::chrono::steady_clock::now();
      if (storm) {
        ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        missed += !s.ok();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // channels connected
  storm = true;
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> publishers;
  std::atomic<bool> stop_publishing{false};
  std::atomic<int> whole_streams{0};
  for (int w = 0; w < workers; ++w) {
    publishers.emplace_back(
        [&, w] { whole_streams += Publish(address, w, snapshots[w], stop_publishing); });
  }
  // The storm lasts until every snapshot is applied (or 60 s); the workers heartbeat meanwhile,
  // and one lease more after it, so an expiry during the storm would show.
  const std::string applied_label = "applied";
  while (Counter(**server, "lazyattn_kvdir_snapshots_total", applied_label) < workers &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(60)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const double storm_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  storm = false;
  std::this_thread::sleep_for(std::chrono::milliseconds(kLeaseMs));
  stop_publishing = true;
  for (std::thread& t : publishers) t.join();
  const int applied =
      static_cast<int>(Counter(**server, "lazyattn_kvdir_snapshots_total", applied_label));
  done = true;
  router.join();
  (*server)->Shutdown();
  if (ms.empty()) {
    std::cerr << "no lookup during the storm\n";
    return 1;
  }
  std::sort(ms.begin(), ms.end());
  const double p50 = ms[ms.size() / 2], p99 = ms[std::min(ms.size() - 1, ms.size() * 99 / 100)];
  std::cout << "kvdir restart storm: " << workers << " workers x " << entries
            << " entries, through gRPC, lease " << kLeaseMs << " ms\n\n"
            << "| storm s | snapshots applied | streams whole | lookups | missed 50 ms | p50 ms | "
               "p99 ms | max ms |\n"
            << "|---|---|---|---|---|---|---|---|\n"
            << "| " << storm_s << " | " << applied << "/" << workers << " | " << whole_streams
            << "/" << workers << " | " << ms.size() << " | " << missed << " | " << p50 << " | "
            << p99 << " | " << ms.back() << " |\n";
  nlohmann::json j = {{"bench", "kvdir_storm"},
                      {"workers", workers},
                      {"entries", entries},
                      {"snapshots_applied", applied},
                      {"streams_whole", whole_streams.load()},
                      {"storm_s", storm_s},
                      {"lookups", ms.size()},
                      {"missed", missed},
                      {"p50_ms", p50},
                      {"p99_ms", p99},
                      {"max_ms", ms.back()}};
  std::cout << j.dump() << "\n";
  return 0;
}

}  // namespace
}  // namespace lazyattn::kvdir

int main(int argc, char** argv) { return lazyattn::kvdir::Main(argc, argv); }
