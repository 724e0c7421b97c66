// The threads the CPU kernels run on: one process-wide pool, sized once from the config
// (engine.cpu_threads / --cpu-threads). OpenBLAS is set to one thread when the pool starts: the
// GEMMs split their work over this pool instead, so two pools never spin on the same cores.
//
// Why a pool of our own: a decode step runs ~120 matrix-vector products of 50-300 us each, so
// waking threads per product must cost a few microseconds. Workers spin briefly after a job (the
// next product follows within microseconds) and then sleep on a futex, so an idle worker process
// burns no CPU.
#ifndef LAZYATTN_KERNELS_INCLUDE_CPU_THREADS_H_
#define LAZYATTN_KERNELS_INCLUDE_CPU_THREADS_H_

#include <cstdint>
#include <type_traits>

namespace lazyattn {

// Physical cores this process may run on (its affinity mask, SMT siblings counted once);
// at least 1.
int PhysicalCoreCount();

// Sets the kernel thread count; n <= 0 means PhysicalCoreCount(). Values above 256 are clamped.
// Safe to call at any time; a parallel loop in flight finishes on the old pool.
void SetCpuKernelThreads(int n);
// The count in use (PhysicalCoreCount() until SetCpuKernelThreads is called).
int CpuKernelThreads();

// Splits [0, n) into at most CpuKernelThreads() contiguous ranges of at least `grain` items
// (a multiple of `grain` except the last) and runs fn(ctx, begin, end) on each, the calling
// thread taking one; returns when all are done. Called while another parallel loop runs (another
// thread's runner), it runs on the calling thread alone rather than waiting.
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
