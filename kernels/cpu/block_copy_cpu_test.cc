#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/half_rows.h"
#include "kernels/cpu/quant_dot.h"
#include "kernels/cpu/quant_int8.h"
#include "kernels/include/block_copy.h"

namespace lazyattn {
namespace {

// The copy must place each key exactly where encoding it at the new position would have: a key
// rotated at local position p, copied with delta, equals the raw key rotated at p + delta.
TEST(BlockCopyCpuTest, CopiedKeysEqualKeysRotatedAtTheNewPosition) {
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> dist(0, 1);
  const int d = 64, kv_heads = 3, layers = 2, pool_blocks = 6;
  PagedKvShape shape{.num_kv_heads = kv_heads, .head_dim = d, .block_size = 16};
  const int64_t layer_stride = pool_blocks * shape.block_stride();
  RopeTable rope(RopeParams{.head_dim = d, .theta = 500000}, 200000);
  std::vector<float> raw_k(layers * layer_stride), k(layers * layer_stride),
      v(layers * layer_stride);
  for (float& x : raw_k) x = dist(rng);
  for (float& x : v) x = dist(rng);
  // Block b holds positions 16 * b + slot (a document at offset 0).
  k = raw_k;
  for (int l = 0; l < layers; ++l)
    for (int b = 0; b < pool_blocks; ++b)
      for (int h = 0; h < kv_heads; ++h)
        for (int s = 0; s < 16; ++s)
          RopeRotateHeadCpu(&k[l * layer_stride + shape.offset(b, h, s)], 16 * b + s, rope);
  const std::vector<float> v_before = v;
  const std::vector<BlockCopy> copies = {{0, 3, 123457}, {1, 4, -16}, {2, 5, 0}};
  BlockCopyRerotateCpu(copies.data(), int(copies.size()), layers, layer_stride, shape, rope,
                       k.data(), v.data());
  for (const BlockCopy& c : copies) {
    for (int l = 0; l < layers; ++l) {
      for (int h = 0; h < kv_heads; ++h) {
        for (int s = 0; s < 16; ++s) {
          std::vector<float> want(&raw_k[l * layer_stride + shape.offset(c.src, h, s)],
                                  &raw_k[l * layer_stride + shape.offset(c.src, h, s)] + d);
          RopeRotateHeadCpu(want.data(), 16 * c.src + s + c.delta, rope);
          const float* got = &k[l * layer_stride + shape.offset(c.dst, h, s)];
          const float* vs = &v_before[l * layer_stride + shape.offset(c.src, h, s)];
          const float* vd = &v[l * layer_stride + shape.offset(c.dst, h, s)];
          for (int x = 0; x < d; ++x) {
            // Two fp32 rotations against one: a few ulp of |k| ~ 1 (angles up to ~1.2e5 rad
            // come from the double table, so no angle error).
            ASSERT_NEAR(got[x], want[x], 2e-5) << "layer " << l << " head " << h << " slot " << s;
            ASSERT_EQ(vd[x], vs[x]);
          }
        }
      }
    }
  }
  // Sources untouched.
  for (int l = 0; l < layers; ++l)
    for (int b = 0; b < 3; ++b)
      for (int h = 0; h < kv_heads; ++h)
        for (int s = 0; s < 16; ++s) {
          std::vector<float> want(&raw_k[l * layer_stride + shape.offset(b, h, s)],
                                  &raw_k[l * layer_stride + shape.offset(b, h, s)] + d);
          RopeRotateHeadCpu(want.data(), 16 * b + s, rope);
          for (int x = 0; x < d; ++x)
            ASSERT_EQ(k[l * layer_stride + shape.offset(b, h, s) + x], want[x]);
        }
}

// F16 pools: values and delta-0 copies move bit for bit; a re-rotated key is the fp32 copy's
// result (from the same half keys) rounded once more to half: within 2^-11 of itself.
TEST(BlockCopyCpuTest, F16PoolsCopyWithinOneMoreHalfRounding) {
  std::mt19937 rng(9);
  std::normal_distribution<float> dist(0, 2);
  const int d = 64, kv_heads = 2, pool_blocks = 4;
  PagedKvShape shape{.num_kv_heads = kv_heads, .head_dim = d, .block_size = 16};
  const int64_t stride = pool_blocks * shape.block_stride();
  RopeTable rope(RopeParams{.head_dim = d, .theta = 10000}, 10000);
  std::vector<float> k(stride), v(stride);
  for (float& x : k) x = dist(rng);
  for (float& x : v) x = dist(rng);
  std::vector<uint16_t> k16(stride), v16(stride);
  cpu_internal::FloatToHalfRow(k.data(), stride, k16.data());
  cpu_internal::FloatToHalfRow(v.data(), stride, v16.data());
  // The fp32 copy starts from the same (half-rounded) keys, so only the second rounding differs.
  for (int64_t i = 0; i < stride; ++i) k[i] = quant_internal::HalfBitsToFloat(k16[i]);
  const std::vector<uint16_t> k16_before = k16, v16_before = v16;
  const std::vector<BlockCopy> copies = {{0, 2, 777}, {1, 3, 0}};
  BlockCopyRerotateCpu(copies.data(), 2, 1, 0, shape, rope, k.data(), v.data());
  BlockCopyRerotateCpu(copies.data(), 2, 1, 0, shape, rope, k16.data(), v16.data());
  for (const BlockCopy& c : copies) {
    for (int64_t i = 0; i < shape.block_stride(); ++i) {
      const int64_t src = shape.offset(c.src, 0, 0) + i, dst = shape.offset(c.dst, 0, 0) + i;
      ASSERT_EQ(v16[dst], v16_before[src]);
      ASSERT_EQ(k16[src], k16_before[src]);  // sources untouched
      if (c.delta == 0) {
        ASSERT_EQ(k16[dst], k16_before[src]);
      } else {
        ASSERT_LE(std::abs(quant_internal::HalfBitsToFloat(k16[dst]) - k[dst]),
                  std::abs(k[dst]) * 0x1p-11f + 1e-6f)
            << "element " << i;
      }
    }
  }
}

}  // namespace
}  // namespace lazyattn
