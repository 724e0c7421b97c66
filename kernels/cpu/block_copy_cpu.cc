#include <cstring>

#include "kernels/include/block_copy.h"

namespace lazyattn {

void KvBlockCopyRerotateCpu(const KvBlockCopy* copies, int num_copies, int64_t delta,
                            const PagedKvShape& shape, const RopeTable& rope, float* k_pool,
                            float* v_pool) {
  const int64_t stride = shape.block_stride();
  for (int c = 0; c < num_copies; ++c) {
    float* k_dst = k_pool + copies[c].dst * stride;
    std::memcpy(k_dst, k_pool + copies[c].src * stride, stride * sizeof(float));
    std::memcpy(v_pool + copies[c].dst * stride, v_pool + copies[c].src * stride,
                stride * sizeof(float));
    if (delta == 0) continue;
    for (int64_t row = 0; row < int64_t{shape.num_kv_heads} * shape.block_size; ++row) {
      RopeRotateHeadCpu(k_dst + row * shape.head_dim, delta, rope);
    }
  }
}

}  // namespace lazyattn
