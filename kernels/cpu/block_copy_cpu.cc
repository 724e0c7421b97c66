#include <cstring>
#include <vector>

#include "kernels/cpu/half_rows.h"
#include "kernels/include/block_copy.h"

namespace lazyattn {
namespace {

// Rotates one stored key row by `delta` in place: an fp32 row directly, a half row through the
// fp32 scratch `row` (rounded to half once more on the way back).
void RotateStoredKey(float* k, int /*head_dim*/, int64_t delta, const RopeTable& rope,
                     std::vector<float>& /*row*/) {
  RopeRotateHeadCpu(k, delta, rope);
}
void RotateStoredKey(uint16_t* k, int head_dim, int64_t delta, const RopeTable& rope,
                     std::vector<float>& row) {
  cpu_internal::HalfToFloatRow(k, head_dim, row.data());
  RopeRotateHeadCpu(row.data(), delta, rope);
  cpu_internal::FloatToHalfRow(row.data(), head_dim, k);
}

// Both pool element types: whole blocks copied as stored, then each key row of a copy with a
// non-zero delta rotated in place.
template <typename T>
void CopyRerotate(const BlockCopy* copies, int num_copies, int num_layers, int64_t layer_stride,
                  const PagedKvShape& shape, const RopeTable& rope, T* k_pool, T* v_pool) {
  std::vector<float> row(shape.head_dim);
  for (int l = 0; l < num_layers; ++l) {
    T* kl = k_pool + l * layer_stride;
    T* vl = v_pool + l * layer_stride;
    for (int c = 0; c < num_copies; ++c) {
      const BlockCopy& cp = copies[c];
      std::memcpy(vl + shape.offset(cp.dst, 0, 0), vl + shape.offset(cp.src, 0, 0),
                  shape.block_stride() * sizeof(T));
      std::memcpy(kl + shape.offset(cp.dst, 0, 0), kl + shape.offset(cp.src, 0, 0),
                  shape.block_stride() * sizeof(T));
      if (cp.delta == 0) continue;
      for (int h = 0; h < shape.num_kv_heads; ++h) {
        for (int s = 0; s < shape.block_size; ++s) {
          RotateStoredKey(kl + shape.offset(cp.dst, h, s), shape.head_dim, cp.delta, rope, row);
        }
      }
    }
  }
}

}  // namespace

void BlockCopyRerotateCpu(const BlockCopy* copies, int num_copies, int num_layers,
                          int64_t layer_stride, const PagedKvShape& shape, const RopeTable& rope,
                          float* k_pool, float* v_pool) {
  CopyRerotate(copies, num_copies, num_layers, layer_stride, shape, rope, k_pool, v_pool);
}

void BlockCopyRerotateCpu(const BlockCopy* copies, int num_copies, int num_layers,
                          int64_t layer_stride, const PagedKvShape& shape, const RopeTable& rope,
                          uint16_t* k_pool, uint16_t* v_pool) {
  CopyRerotate(copies, num_copies, num_layers, layer_stride, shape, rope, k_pool, v_pool);
}

}  // namespace lazyattn
