#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/include/block_copy.h"

namespace lazyattn {
namespace {

TEST(KvBlockCopyRerotateCpuTest, CopyAtNewOffsetEqualsEncodingThere) {
  const PagedKvShape shape{.num_kv_heads = 2, .head_dim = 16, .block_size = 16};
  RopeTable rope(RopeParams{.head_dim = 16, .theta = 10000}, 100000);
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0, 1);
  std::vector<float> raw(shape.block_stride());
  for (float& x : raw) x = dist(rng);
  // Block 0: keys rotated at global positions 70000 + slot; block 2 expected at 300 + slot.
  std::vector<float> k(4 * shape.block_stride(), NAN), v(4 * shape.block_stride(), NAN),
      expected = raw;
  std::copy(raw.begin(), raw.end(), k.begin());
  std::copy(raw.begin(), raw.end(), v.begin());
  for (int h = 0; h < 2; ++h) {
    for (int s = 0; s < 16; ++s) {
      RopeRotateHeadCpu(&k[shape.offset(0, h, s)], 70000 + s, rope);
      RopeRotateHeadCpu(&expected[shape.offset(0, h, s)], 300 + s, rope);
    }
  }
  const KvBlockCopy copy{.src = 0, .dst = 2};
  KvBlockCopyRerotateCpu(&copy, 1, 300 - 70000, shape, rope, k.data(), v.data());
  for (int64_t i = 0; i < shape.block_stride(); ++i) {
    ASSERT_NEAR(k[2 * shape.block_stride() + i], expected[i], 2e-4) << i;
    ASSERT_EQ(v[2 * shape.block_stride() + i], raw[i]) << i;
  }
  EXPECT_TRUE(std::isnan(k[shape.block_stride()])) << "wrote outside the destination block";
}

}  // namespace
}  // namespace lazyattn
