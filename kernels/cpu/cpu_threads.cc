#include "kernels/include/cpu_threads.h"

#include <cblas.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
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

// Workers 1..n-1 (the caller is worker 0). Every worker acknowledges every generation, taking
// part or not, so the job fields are never rewritten while a worker may read them.
class Pool {
 public:
  explicit Pool(int threads) : threads_(threads) {
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { Work(i); });
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
    const int parts = static_cast<int>(std::min<int64_t>(threads_, units));
    if (parts <= 1) {
      fn(ctx, 0, n);
      return;
    }
    fn_ = fn;
    ctx_ = ctx;
    n_ = n;
    chunk_ = (units + parts - 1) / parts * grain;
    pending_.store(threads_ - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    fn(ctx, 0, std::min(chunk_, n));
    for (int left = threads_ - 1; left != 0;) left = AwaitChange(pending_, left, 200);
  }

 private:
  void Work(int index) {
    uint64_t seen = 0;
    for (;;) {
      seen = AwaitChange(generation_, seen, kIdleSpinUs);
      if (stop_.load(std::memory_order_relaxed)) return;
      const int64_t begin = index * chunk_;
      if (begin < n_) fn_(ctx_, begin, std::min(begin + chunk_, n_));
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
    }
  }

  // How long a worker spins for the next job before sleeping: a decode step's products follow
  // each other within tens of microseconds.
  static constexpr int kIdleSpinUs = 100;

  const int threads_;
  std::vector<std::thread> workers_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  CpuRangeFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_ = 0, chunk_ = 0;
};

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
    pool = std::make_unique<Pool>(n);
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

void SetCpuKernelThreads(int n) {
  const int threads = n <= 0 ? PhysicalCoreCount() : std::min(n, 256);
  std::lock_guard<std::mutex> lock(PoolMutex());
  RequestedThreads().store(threads, std::memory_order_relaxed);
  std::unique_ptr<Pool>& pool = PoolSlot();
  if (pool != nullptr && pool->threads() == threads) return;
  pool.reset();  // created again, with OpenBLAS's count, on next use
}

int CpuKernelThreads() {
  const int n = RequestedThreads().load(std::memory_order_relaxed);
  return n > 0 ? n : PhysicalCoreCount();
}

void CpuParallelRanges(int64_t n, int64_t grain, CpuRangeFn fn, void* ctx) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  std::unique_lock<std::mutex> lock(PoolMutex(), std::try_to_lock);
  if (!lock.owns_lock()) {
    fn(ctx, 0, n);
    return;
  }
  PoolLocked().Run(n, grain, fn, ctx);
}

}  // namespace lazyattn
