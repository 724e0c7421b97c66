#include <cstring>
#include <vector>

#include "kernels/cpu/half_rows.h"
#include "kernels/include/block_copy.h"

namespace lazyattn {

void BlockCopyRerotateCpu(const BlockCopy* copies, int num_copies, int num_layers,
                          int64_t layer_stride, const PagedKvShape& shape, const RopeTable& rope,
                          float* k_pool, float* v_pool) {
  for (int l = 0; l < num_layers; ++l) {
    float* kl = k_pool + l * layer_stride;
    float* vl = v_pool + l * layer_stride;
    for (int c = 0; c < num_copies; ++c) {
      const BlockCopy& cp = copies[c];
      std::memcpy(vl + shape.offset(cp.dst, 0, 0), vl + shape.offset(cp.src, 0, 0),
                  shape.block_stride() * sizeof(float));
      std::memcpy(kl + shape.offset(cp.dst, 0, 0), kl + shape.offset(cp.src, 0, 0),
                  shape.block_stride() * sizeof(float));
      if (cp.delta == 0) continue;
      for (int h = 0; h < shape.num_kv_heads; ++h) {
        for (int s = 0; s < shape.block_size; ++s) {
          RopeRotateHeadCpu(kl + shape.offset(cp.dst, h, s), cp.delta, rope);
        }
      }
    }
  }
}

void BlockCopyRerotateCpu(const BlockCopy* copies, int num_copies, int num_layers,
                          int64_t layer_stride, const PagedKvShape& shape, const RopeTable& rope,
                          uint16_t* k_pool, uint16_t* v_pool) {
  std::vector<float> row(shape.head_dim);
  for (int l = 0; l < num_layers; ++l) {
    uint16_t* kl = k_pool + l * layer_stride;
    uint16_t* vl = v_pool + l * layer_stride;
    for (int c = 0; c < num_copies; ++c) {
      const BlockCopy& cp = copies[c];
      std::memcpy(vl + shape.offset(cp.dst, 0, 0), vl + shape.offset(cp.src, 0, 0),
                  shape.block_stride() * sizeof(uint16_t));
      std::memcpy(kl + shape.offset(cp.dst, 0, 0), kl + shape.offset(cp.src, 0, 0),
                  shape.block_stride() * sizeof(uint16_t));
      if (cp.delta == 0) continue;
      for (int h = 0; h < shape.num_kv_heads; ++h) {
        for (int s = 0; s < shape.block_size; ++s) {
          uint16_t* k = kl + shape.offset(cp.dst, h, s);
          cpu_internal::HalfToFloatRow(k, shape.head_dim, row.data());
          RopeRotateHeadCpu(row.data(), cp.delta, rope);
          cpu_internal::FloatToHalfRow(row.data(), shape.head_dim, k);
        }
      }
    }
  }
}

}  // namespace lazyattn
