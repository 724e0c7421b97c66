// A kvdir restart as routers see it, through gRPC: a kvdir server (insecure, in this process) and
// N workers that each say hello and send one full snapshot at once, while a router looks 5
// documents up every millisecond with the router's 50 ms deadline. Prints the lookups that missed
// their deadline and the latency percentiles during the storm, as a Markdown row and a JSON line.
// (tools/bench/kvdir_index_bench.cc measures the index alone.)
//
//   lazyattn-bench-kvdir-storm [--workers 8] [--entries 262144]
#include <grpcpp/grpcpp.h>

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

v1::DocKey KeyOf(int worker, int64_t i) {
  v1::DocKey k;
  k.set_hi(static_cast<uint64_t>(worker) << 40 | static_cast<uint64_t>(i));
  k.set_lo(~static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull);
  return k;
}

// Hello as worker-`w`, then `snapshot` (made beforehand, so the storm times kvdir, not this).
void Publish(const std::string& address, int w, const v1::WorkerMessage& snapshot) {
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
  if (!stream->Write(hello) || !stream->Read(&reply) || !stream->Read(&reply) ||
      !stream->Write(snapshot)) {
    std::cerr << "worker-" << w << ": the stream broke\n";
  }
  stream->WritesDone();
  while (stream->Read(&reply)) {
  }
  (void)stream->Finish();
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
  options.lease_ms = 60000;
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
  for (int w = 0; w < workers; ++w) {
    publishers.emplace_back([&, w] { Publish(address, w, snapshots[w]); });
  }
  for (std::thread& t : publishers) t.join();
  const double storm_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  storm = false;
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
            << " entries, through gRPC\n\n"
            << "| storm s | lookups | missed 50 ms | p50 ms | p99 ms | max ms |\n"
            << "|---|---|---|---|---|---|\n"
            << "| " << storm_s << " | " << ms.size() << " | " << missed << " | " << p50 << " | "
            << p99 << " | " << ms.back() << " |\n";
  nlohmann::json j = {{"bench", "kvdir_storm"}, {"workers", workers},   {"entries", entries},
                      {"storm_s", storm_s},     {"lookups", ms.size()}, {"missed", missed},
                      {"p50_ms", p50},          {"p99_ms", p99},        {"max_ms", ms.back()}};
  std::cout << j.dump() << "\n";
  return 0;
}

}  // namespace
}  // namespace lazyattn::kvdir

int main(int argc, char** argv) { return lazyattn::kvdir::Main(argc, argv); }
