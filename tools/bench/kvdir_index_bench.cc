// kvdir's DirectoryIndex under the load of a kvdir restart: every worker says hello and sends a
// full snapshot at once, while routers keep looking documents up (each lookup has a 50 ms
// deadline at the router). Prints how long each snapshot takes to apply and the lookup latency
// percentiles with and without snapshots arriving, as a Markdown table and a JSON line.
//
//   lazyattn-bench-kvdir-index [--workers 8] [--entries 262144] [--rounds 3]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/monotonic_time.h"
#include "nlohmann/json.hpp"
#include "services/kvdir/index/directory_index.h"
#include "tools/cli/cli_args.h"

namespace lazyattn::kvdir {
namespace {

DocumentKey KeyOf(int worker, int64_t i) {
  const uint64_t n = (static_cast<uint64_t>(worker) << 40) | static_cast<uint64_t>(i);
  return DocumentKey{n * 0x9E3779B97F4A7C15ull + 1, ~n};
}

struct Percentiles {
  double p50_ms = 0, p99_ms = 0, max_ms = 0;
  int64_t count = 0;
};

Percentiles Summarize(std::vector<double> ms) {
  Percentiles p;
  p.count = static_cast<int64_t>(ms.size());
  if (ms.empty()) return p;
  std::sort(ms.begin(), ms.end());
  p.p50_ms = ms[ms.size() / 2];
  p.p99_ms = ms[std::min(ms.size() - 1, ms.size() * 99 / 100)];
  p.max_ms = ms.back();
  return p;
}

// Lookups of 5 documents (of worker 0, so each answer names a worker) in a loop until `stop`.
std::vector<double> LookupLoop(const DirectoryIndex& index, const std::atomic<bool>& stop,
                               int64_t entries) {
  std::vector<double> ms;
  int64_t i = 0;
  while (!stop.load(std::memory_order_relaxed)) {
    std::vector<DocumentKey> keys;
    for (int k = 0; k < 5; ++k) keys.push_back(KeyOf(0, (i * 5 + k) % entries));
    ++i;
    const auto t0 = std::chrono::steady_clock::now();
    auto workers = index.Lookup(keys, ResidencyRule::kAnyEntry, {}, MonotonicNow());
    const auto t1 = std::chrono::steady_clock::now();
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    if (workers.empty()) std::abort();  // the bench's own invariant: worker 0 is always there
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return ms;
}

int Main(int argc, char** argv) {
  CliArgs args;
  args.Declare("workers", CliArgs::Kind::kValue, "workers snapshotting at once (default 8)");
  args.Declare("entries", CliArgs::Kind::kValue, "entries in each snapshot (default 262144)");
  args.Declare("rounds", CliArgs::Kind::kValue, "snapshot rounds of all workers (default 3)");
  if (absl::Status s = args.Parse(argc, argv, 1); !s.ok()) {
    std::cerr << s.message() << "\n" << args.Help();
    return 2;
  }
  const int workers = static_cast<int>(args.Int("workers", 8).value_or(8));
  const int64_t entries = args.Int("entries", 262144).value_or(262144);
  const int rounds = static_cast<int>(args.Int("rounds", 3).value_or(3));
  if (workers < 1 || workers > 1024 || entries < 5 || entries > (1 << 22) || rounds < 1) {
    std::cerr << "--workers 1..1024, --entries 5..4194304, --rounds >= 1\n";
    return 2;
  }
  DirectoryIndex index(absl::Seconds(3600), IndexLimits{.max_entries_per_worker = entries,
                                                        .max_entries = entries * workers});
  std::vector<std::vector<DocEntry>> snapshots(workers);
  std::vector<uint64_t> sessions(workers);
  std::vector<uint64_t> seqs(workers, 1);
  for (int w = 0; w < workers; ++w) {
    for (int64_t i = 0; i < entries; ++i) snapshots[w].push_back({KeyOf(w, i), 4096, kLazyOffset});
    v1::WorkerStatus status;
    status.set_worker_id(absl::StrCat("worker-", w));
    status.set_address(absl::StrCat("worker-", w, ":7200"));
    sessions[w] = index.Hello(status, 1, seqs[w]++, MonotonicNow(), {}).session;
  }
  // Worker 0 first, so the lookups always find it.
  (void)index.ApplySnapshot("worker-0", sessions[0], seqs[0]++, snapshots[0], nullptr,
                            MonotonicNow());

  std::atomic<bool> stop{false};
  std::vector<double> quiet;
  {
    std::thread t([&] { quiet = LookupLoop(index, stop, entries); });
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    stop = true;
    t.join();
  }
  stop = false;
  std::vector<double> busy, apply_ms;
  {
    std::thread t([&] { busy = LookupLoop(index, stop, entries); });
    for (int r = 0; r < rounds; ++r) {
      for (int w = 0; w < workers; ++w) {
        const auto t0 = std::chrono::steady_clock::now();
        const ApplyResult result =
            index.ApplySnapshot(absl::StrCat("worker-", w), sessions[w], seqs[w]++, snapshots[w],
                                nullptr, MonotonicNow());
        const auto t1 = std::chrono::steady_clock::now();
        if (result.outcome != ApplyOutcome::kApplied) {
          std::cerr << "snapshot of worker-" << w << " not applied\n";
          return 1;
        }
        apply_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      }
    }
    stop = true;
    t.join();
  }
  const Percentiles q = Summarize(quiet), b = Summarize(busy), a = Summarize(apply_ms);
  std::cout << "kvdir index: " << workers << " workers x " << entries << " entries, " << rounds
            << " rounds of snapshots (" << a.count << " in all)\n\n"
            << "| | p50 ms | p99 ms | max ms | count |\n|---|---|---|---|---|\n"
            << "| snapshot apply | " << a.p50_ms << " | " << a.p99_ms << " | " << a.max_ms << " | "
            << a.count << " |\n"
            << "| lookup, no snapshots | " << q.p50_ms << " | " << q.p99_ms << " | " << q.max_ms
            << " | " << q.count << " |\n"
            << "| lookup, snapshots arriving | " << b.p50_ms << " | " << b.p99_ms << " | "
            << b.max_ms << " | " << b.count << " |\n";
  nlohmann::json j = {
      {"bench", "kvdir_index"},
      {"workers", workers},
      {"entries", entries},
      {"snapshot_apply_ms", {{"p50", a.p50_ms}, {"max", a.max_ms}}},
      {"lookup_quiet_ms", {{"p50", q.p50_ms}, {"p99", q.p99_ms}, {"max", q.max_ms}}},
      {"lookup_busy_ms", {{"p50", b.p50_ms}, {"p99", b.p99_ms}, {"max", b.max_ms}}}};
  std::cout << j.dump() << "\n";
  return 0;
}

}  // namespace
}  // namespace lazyattn::kvdir

int main(int argc, char** argv) { return lazyattn::kvdir::Main(argc, argv); }
