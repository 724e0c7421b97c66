// The handshake of split kernels (split-K products, split decode attention): each CTA of a group
// stores its partial result, counts itself in at a per-group counter, and the CTA that arrives
// last reads every partial and finishes the group.
//
// Usage, by every thread of the CTA (or of the named barrier group that stored the partials):
//   store the partial (st.global.cg / __stcg);
//   CTA barrier;
//   thread 0: last = ArriveAtSplitCounter(counter, splits) (resets the counter when last);
//   CTA barrier (share `last` through shared memory);
//   if last: read the partials with ld.global.cg (__ldcg), never through L1.
// This is the ordering the PTX memory model gives a barrier followed by one thread's release,
// and one thread's acquire followed by a barrier (the pattern of CUTLASS's split-K semaphore and
// of cooperative groups' grid sync): the stores of every thread are ordered before the release
// by the barrier, and the reads after the acquire by the second barrier. A __threadfence() in
// every thread (a sequentially consistent fence, MEMBAR.SC.GPU) is not needed for it.
#ifndef LAZYATTN_KERNELS_CUDA_SPLIT_ARRIVAL_CUH_
#define LAZYATTN_KERNELS_CUDA_SPLIT_ARRIVAL_CUH_

#include <cuda_runtime.h>

namespace lazyattn {

// Adds one to *counter with acquire-release semantics at GPU scope; true for the `splits`-th
// arrival, which also sets the counter back to zero for the next launch (the kernel boundary
// orders that store before the next launch reads it). Call from one thread.
__device__ __forceinline__ bool ArriveAtSplitCounter(int* counter, int splits) {
  int arrived;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;"
               : "=r"(arrived)
               : "l"(counter)
               : "memory");
  const bool last = arrived == splits - 1;
  if (last) {
    asm volatile("st.relaxed.gpu.global.s32 [%0], 0;" ::"l"(counter) : "memory");
  }
  return last;
}

}  // namespace lazyattn

#endif  // LAZYATTN_KERNELS_CUDA_SPLIT_ARRIVAL_CUH_
