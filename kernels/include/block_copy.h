// Copy of KV blocks with re-rotation of K: mode `block` reuses a document cached at global offset
// o1 for a request that places it at o2 by copying its blocks and rotating every key by
// o2 - o1 (R_{o2-o1} R_{o1+m} k = R_{o2+m} k). V is copied unchanged. (CPU twin.)
#ifndef LAZYATTN_KERNELS_INCLUDE_BLOCK_COPY_H_
#define LAZYATTN_KERNELS_INCLUDE_BLOCK_COPY_H_

#include <cstdint>

#include "kernels/include/paged_attention.h"
#include "kernels/include/rope.h"

namespace lazyattn {

struct KvBlockCopy {
  uint32_t src;
  uint32_t dst;  // must differ from every src of the same call
};

// One layer's pools. `delta` may be negative; |delta| < rope.max_positions().
void KvBlockCopyRerotateCpu(const KvBlockCopy* copies, int num_copies, int64_t delta,
                            const PagedKvShape& shape, const RopeTable& rope, float* k_pool,
                            float* v_pool);

}  // namespace lazyattn

#endif  // LAZYATTN_KERNELS_INCLUDE_BLOCK_COPY_H_
