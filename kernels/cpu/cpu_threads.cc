#include "kernels/include/cpu_threads.h"

#include <cblas.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace lazyattn {
namespace {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Spins while `value` equals `old` for up to ~spin_us, then sleeps on the futex until it changes.
template <typename T>
T AwaitChange(const std::atomic<T>& value, T old, int spin_us) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us);
  for (int i = 0;; ++i) {
    const T v = value.load(std::memory_order_acquire);
    if (v != old) return v;
    if ((i & 255) == 255 && std::chrono::steady_clock::now() > deadline) break;
    CpuRelax();
  }
  for (;;) {
    value.wait(old, std::memory_order_acquire);
    const T v = value.load(std::memory_order_acquire);
    if (v != old) return v;
  }
}

// Set on the pool's threads and on a caller while its loop runs: a parallel loop started there
// runs inline (the caller already holds the pool's mutex; a pool thread must not wait for itself).
thread_local bool in_parallel_region = false;

// Workers 1..n-1 beside the caller. A job is cut into a few chunks per thread that every
// participant claims from one atomic word, so a worker the OS has not scheduled yet (the machine
// is shared) costs nothing: the others take its chunks, and the caller waits only for chunks
// already claimed. The word packs (generation, chunk count, next chunk): a claim succeeds only
// for the job it was meant for, and the job fields stay unchanged while a claimed chunk runs.
class Pool {
 public:
  // spin_us: how long a worker (and the caller, for its helpers) spins before sleeping.
  Pool(int threads, int spin_us) : threads_(threads), spin_us_(spin_us) {
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { Work(); });
  }
  ~Pool() {
    stop_.store(true, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int threads() const { return threads_; }

  void Run(int64_t n, int64_t grain, CpuRangeFn fn, void* ctx) {
    const int64_t units = (n + grain - 1) / grain;
    const int64_t chunks = std::min<int64_t>(units, int64_t{threads_} * kChunksPerThread);
    if (threads_ <= 1 || chunks <= 1) {
      fn(ctx, 0, n);
      return;
    }
    fn_ = fn;
    ctx_ = ctx;
    n_ = n;
    chunk_ = (units + chunks - 1) / chunks * grain;
    const int64_t count = (n + chunk_ - 1) / chunk_;
    done_.store(0, std::memory_order_relaxed);
    const uint64_t gen = generation_.load(std::memory_order_relaxed) + 1;
    claim_.store(Word(gen, count, 0), std::memory_order_release);
    generation_.store(gen, std::memory_order_release);
    generation_.notify_all();
    RunChunks(gen);
    for (int64_t d = done_.load(std::memory_order_acquire); d != count;) {
      d = AwaitChange(done_, d, spin_us_);
    }
  }

 private:
  static constexpr int64_t kChunksPerThread = 4;
  static uint64_t Word(uint64_t gen, int64_t count, int64_t next) {
    return (gen & 0xFFFFFF) << 40 | static_cast<uint64_t>(count) << 20 |
           static_cast<uint64_t>(next);
  }

  // Claims and runs chunks of job `gen` until none is left.
  void RunChunks(uint64_t gen) {
    uint64_t w = claim_.load(std::memory_order_acquire);
    for (;;) {
      const int64_t count = static_cast<int64_t>((w >> 20) & 0xFFFFF);
      const int64_t next = static_cast<int64_t>(w & 0xFFFFF);
      if ((w >> 40) != (gen & 0xFFFFFF) || next >= count) return;
      if (!claim_.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel)) continue;
      const int64_t begin = next * chunk_;
      fn_(ctx_, begin, std::min(begin + chunk_, n_));
      if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == count) done_.notify_one();
      w = claim_.load(std::memory_order_acquire);
    }
  }

  void Work() {
    in_parallel_region = true;
    uint64_t seen = 0;
    for (;;) {
      seen = AwaitChange(generation_, seen, spin_us_);
      if (stop_.load(std::memory_order_relaxed)) return;
      RunChunks(seen);
    }
  }

  const int threads_;  // the chunk count (< 2^20) is at most kChunksPerThread * 256
  const int spin_us_;
  std::vector<std::thread> workers_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<uint64_t> claim_{0};
  std::atomic<int64_t> done_{0};
  std::atomic<bool> stop_{false};
  CpuRangeFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_ = 0, chunk_ = 0;
};

constexpr int kIdleSpinUs = 30;

std::optional<int64_t> ParseInt(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

std::optional<int> QuotaCpus(int64_t quota, int64_t period) {
  if (quota <= 0 || period <= 0) return std::nullopt;
  return static_cast<int>(std::min<int64_t>((quota + period - 1) / period, 1 << 20));
}

std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::mutex& PoolMutex() {
  static std::mutex mu;
  return mu;
}
std::unique_ptr<Pool>& PoolSlot() {  // guarded by PoolMutex
  static std::unique_ptr<Pool> pool;
  return pool;
}
std::atomic<int>& RequestedThreads() {
  static std::atomic<int> n{0};
  return n;
}

// Creates the pool on first use (and OpenBLAS's thread count with it). Caller holds PoolMutex.
Pool& PoolLocked() {
  std::unique_ptr<Pool>& pool = PoolSlot();
  if (pool == nullptr) {
    const int n = CpuKernelThreads();
    // Every parallel loop runs on this pool (the GEMM path splits its products over it): an
    // OpenBLAS pool too would spin on the same cores, and a decode step's small attention
    // products would wait for its threads while ours spin.
    openblas_set_num_threads(1);
    // A decode step's products follow each other within tens of microseconds, so a short spin
    // catches the next one. Longer spins starved the engine's other threads when the cores were
    // shared (decode fell to ~4 tokens/s with 1-2 ms; 100 us throttled 2-CPU containers). With
    // more threads than the budget, a spinning thread takes the CPU from one doing the work.
    pool = std::make_unique<Pool>(n, n > CpuBudget() ? 0 : kIdleSpinUs);
  }
  return *pool;
}

}  // namespace

int PhysicalCoreCount() {
  static const int count = [] {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) {
      return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    }
    std::set<std::pair<std::string, std::string>> cores;  // (package, core) of each usable CPU
    int cpus = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (!CPU_ISSET(cpu, &set)) continue;
      ++cpus;
      const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
      std::string package, core;
      std::ifstream(dir + "physical_package_id") >> package;
      std::ifstream(dir + "core_id") >> core;
      if (core.empty()) core = "cpu" + std::to_string(cpu);  // no topology: count CPUs
      cores.emplace(package, core);
    }
    return std::max(1, static_cast<int>(cores.empty() ? cpus : cores.size()));
  }();
  return count;
}

std::optional<int> ParseCgroupV2CpuMax(std::string_view cpu_max) {
  const size_t space = cpu_max.find(' ');
  if (space == std::string_view::npos) return std::nullopt;
  const std::optional<int64_t> quota = ParseInt(cpu_max.substr(0, space));  // "max": none
  const std::optional<int64_t> period = ParseInt(cpu_max.substr(space + 1));
  if (!quota || !period) return std::nullopt;
  return QuotaCpus(*quota, *period);
}

std::optional<int> ParseCgroupV1CpuQuota(std::string_view quota_us, std::string_view period_us) {
  const std::optional<int64_t> quota = ParseInt(quota_us);  // -1: none
  const std::optional<int64_t> period = ParseInt(period_us);
  if (!quota || !period) return std::nullopt;
  return QuotaCpus(*quota, *period);
}

std::optional<int> CgroupCpuQuota(const std::string& root) {
  if (const std::optional<std::string> v2 = ReadFile(root + "/cpu.max")) {
    return ParseCgroupV2CpuMax(*v2);
  }
  for (const char* dir : {"/cpu/", "/cpu,cpuacct/", "/cpuacct,cpu/"}) {
    const std::optional<std::string> quota = ReadFile(root + dir + "cpu.cfs_quota_us");
    const std::optional<std::string> period = ReadFile(root + dir + "cpu.cfs_period_us");
    if (quota && period) return ParseCgroupV1CpuQuota(*quota, *period);
  }
  return std::nullopt;
}

int CpuBudget() {
  static const int budget = [] {
    const std::optional<int> quota = CgroupCpuQuota("/sys/fs/cgroup");
    return std::max(1, quota ? std::min(*quota, PhysicalCoreCount()) : PhysicalCoreCount());
  }();
  return budget;
}

int DefaultCpuKernelThreadsFrom(int physical_cores, std::optional<int> quota,
                                const char* openblas_threads, const char* omp_threads) {
  int n = std::max(1, physical_cores);
  if (quota && *quota > 0) n = std::min(n, *quota);
  // OpenBLAS reads OPENBLAS_NUM_THREADS before OMP_NUM_THREADS; the first positive one counts.
  for (const char* env : {openblas_threads, omp_threads}) {
    if (env == nullptr) continue;
    const std::optional<int64_t> v = ParseInt(env);
    if (v && *v > 0) {
      n = static_cast<int>(std::min<int64_t>(n, *v));
      break;
    }
  }
  return std::min(n, 256);
}

int DefaultCpuKernelThreads() {
  return DefaultCpuKernelThreadsFrom(PhysicalCoreCount(), CgroupCpuQuota("/sys/fs/cgroup"),
                                     std::getenv("OPENBLAS_NUM_THREADS"),
                                     std::getenv("OMP_NUM_THREADS"));
}

int64_t CpuWorkGrain(int64_t n, int64_t grain, int64_t work_per_item) {
  grain = std::max<int64_t>(grain, 1);
  work_per_item = std::max<int64_t>(work_per_item, 1);
  if (n <= 0) return grain;
  // n * work_per_item < kCpuMinParallelWork, without overflow.
  if (n < (kCpuMinParallelWork + work_per_item - 1) / work_per_item) return n;
  const int64_t min_items = (kCpuMinRangeWork + work_per_item - 1) / work_per_item;
  return std::max(grain, (min_items + grain - 1) / grain * grain);
}

void SetCpuKernelThreads(int n) {
  const int threads = n <= 0 ? DefaultCpuKernelThreads() : std::min(n, 256);
  std::lock_guard<std::mutex> lock(PoolMutex());
  RequestedThreads().store(threads, std::memory_order_relaxed);
  std::unique_ptr<Pool>& pool = PoolSlot();
  if (pool != nullptr && pool->threads() == threads) return;
  pool.reset();  // created again, with OpenBLAS's count, on next use
}

int CpuKernelThreads() {
  const int n = RequestedThreads().load(std::memory_order_relaxed);
  if (n > 0) return n;
  static const int default_threads = DefaultCpuKernelThreads();
  return default_threads;
}

void CpuParallelRanges(int64_t n, int64_t grain, CpuRangeFn fn, void* ctx) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  // One range, or a nested loop (this thread holds the mutex or is a pool thread): run inline
  // before touching the mutex, which a nested try_lock by its owner would make undefined.
  if (n <= grain || in_parallel_region) {
    fn(ctx, 0, n);
    return;
  }
  std::unique_lock<std::mutex> lock(PoolMutex(), std::try_to_lock);
  if (!lock.owns_lock()) {
    fn(ctx, 0, n);
    return;
  }
  in_parallel_region = true;  // the kernels do not throw
  PoolLocked().Run(n, grain, fn, ctx);
  in_parallel_region = false;
}

}  // namespace lazyattn
