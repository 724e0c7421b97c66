// The threads the CPU kernels run on: one process-wide pool, sized once from the config
// (engine.cpu_threads / --cpu-threads), by default from the process's CPU budget (affinity mask,
// cgroup quota, OPENBLAS_NUM_THREADS / OMP_NUM_THREADS). OpenBLAS is set to one thread when the
// pool starts: the GEMMs split their work over this pool instead, so two pools never spin on the
// same cores.
//
// Why a pool of our own: a decode step runs ~120 matrix-vector products of 50-300 us each, so
// waking threads per product must cost a few microseconds. Workers spin briefly (tens of
// microseconds) after a job, the next product following within microseconds, and then sleep on a
// futex, so an idle worker process burns no CPU. A pool larger than the CPU budget never spins:
// its spinning threads would take the quota from the ones doing the work.
#ifndef LAZYATTN_KERNELS_INCLUDE_CPU_THREADS_H_
#define LAZYATTN_KERNELS_INCLUDE_CPU_THREADS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

namespace lazyattn {

// Physical cores this process may run on (its affinity mask, SMT siblings counted once);
// at least 1.
int PhysicalCoreCount();

// CPUs a cgroup quota allows, rounded up: from cgroup v2 cpu.max contents ("max 100000" -> none,
// "150000 100000" -> 2), or from cgroup v1 cpu.cfs_quota_us / cpu.cfs_period_us contents
// ("-1" -> none). nullopt when unlimited or unreadable.
std::optional<int> ParseCgroupV2CpuMax(std::string_view cpu_max);
std::optional<int> ParseCgroupV1CpuQuota(std::string_view quota_us, std::string_view period_us);
// The quota of the cgroup mounted at `root` (normally /sys/fs/cgroup, the container's own cgroup):
// root/cpu.max (v2), else root/cpu/ or root/cpu,cpuacct/cpu.cfs_quota_us (v1).
std::optional<int> CgroupCpuQuota(const std::string& root);

// What the process may use: min(PhysicalCoreCount(), CgroupCpuQuota("/sys/fs/cgroup")); at least 1.
int CpuBudget();
// The default kernel thread count: CpuBudget(), lowered to OPENBLAS_NUM_THREADS or else
// OMP_NUM_THREADS when set to a positive number (deployments set them to the CPU limit).
int DefaultCpuKernelThreads();
// The same from explicit inputs, for tests: cores, quota (nullopt: none) and the two variables'
// values (nullptr: unset).
int DefaultCpuKernelThreadsFrom(int physical_cores, std::optional<int> quota,
                                const char* openblas_threads, const char* omp_threads);

// Sets the kernel thread count; n <= 0 means DefaultCpuKernelThreads(). Values above 256 are
// clamped. Safe to call at any time; a parallel loop in flight finishes on the old pool.
void SetCpuKernelThreads(int n);
// The count in use (DefaultCpuKernelThreads() until SetCpuKernelThreads is called).
int CpuKernelThreads();

// Products smaller than this many multiply-adds run on the calling thread (waking threads costs
// more than it saves), and a parallel range gets at least kCpuMinRangeWork of them.
inline constexpr int64_t kCpuMinParallelWork = 64 * 1024;
inline constexpr int64_t kCpuMinRangeWork = 16 * 1024;
// The grain for n items of `work_per_item` multiply-adds each: n (one range, on the caller) when
// the total is below kCpuMinParallelWork, else the smallest multiple of `grain` holding
// kCpuMinRangeWork.
int64_t CpuWorkGrain(int64_t n, int64_t grain, int64_t work_per_item);

// Splits [0, n) into at most CpuKernelThreads() contiguous ranges of at least `grain` items
// (a multiple of `grain` except the last) and runs fn(ctx, begin, end) on each, the calling
// thread taking one; returns when all are done. One range runs on the caller without touching
// the pool. Called inside a parallel loop (nested, on the caller's or a pool thread) or while
// another thread's loop runs, it runs on the calling thread alone rather than waiting.
using CpuRangeFn = void (*)(void* ctx, int64_t begin, int64_t end);
void CpuParallelRanges(int64_t n, int64_t grain, CpuRangeFn fn, void* ctx);

// The same for a callable taking (begin, end).
template <typename F>
void CpuParallelFor(int64_t n, int64_t grain, F&& f) {
  using Fn = std::remove_reference_t<F>;
  CpuParallelRanges(
      n, grain, [](void* ctx, int64_t begin, int64_t end) { (*static_cast<Fn*>(ctx))(begin, end); },
      const_cast<void*>(static_cast<const void*>(&f)));
}

}  // namespace lazyattn

#endif  // LAZYATTN_KERNELS_INCLUDE_CPU_THREADS_H_
