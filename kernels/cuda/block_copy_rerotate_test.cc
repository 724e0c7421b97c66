#include "kernels/cuda/block_copy_rerotate.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/include/block_copy.h"

namespace lazyattn {
namespace {

using testing::Bf16BitsToFloat;
using testing::DeviceBuffer;
using testing::FloatToBf16Bits;

// Several copies (positive, negative and zero deltas up to 200,000) across 3 layers against the
// CPU twin on the same bf16 pools. K: one bf16 rounding of an fp32 rotation with the same
// cos/sin, |got - want| <= 2^-8 |want| + 1e-6; V and untouched blocks bit-exact.
TEST(BlockCopyRerotateTest, MatchesCpuTwin) {
  SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0, 1);
  for (int d : {64, 128}) {
    const int KH = 3, layers = 3, pool_blocks = 40;
    PagedKvShape shape{.num_kv_heads = KH, .head_dim = d, .block_size = 16};
    const int64_t layer_stride = pool_blocks * shape.block_stride() + 64;  // padded layers
    RopeTable rope(RopeParams{.head_dim = d, .theta = 500000}, 200001);
    auto dev_rope = DeviceRopeTable::Create(rope);
    ASSERT_TRUE(dev_rope.ok()) << dev_rope.status();
    std::vector<uint16_t> k(layers * layer_stride), v(layers * layer_stride);
    for (auto& x : k) x = FloatToBf16Bits(normal(rng));
    for (auto& x : v) x = FloatToBf16Bits(normal(rng));
    std::vector<int> blocks(pool_blocks);
    for (int i = 0; i < pool_blocks; ++i) blocks[i] = i;
    std::shuffle(blocks.begin(), blocks.end(), rng);
    std::uniform_int_distribution<int32_t> delta(-200000, 200000);
    std::vector<BlockCopy> copies;
    for (int i = 0; i < 17; ++i) {
      copies.push_back({uint32_t(blocks[i]), uint32_t(blocks[20 + i]),
                        i == 0 ? 0 : i == 1 ? 200000 : i == 2 ? -200000 : delta(rng)});
    }
    DeviceBuffer<uint16_t> dk, dv;
    dk.Upload(k);
    dv.Upload(v);
    DeviceBuffer<BlockCopy> dc;
    dc.Upload(copies);
    BlockCopyRerotateArgs a;
    a.copies = dc.get();
    a.num_copies = int(copies.size());
    a.num_layers = layers;
    a.layer_stride = layer_stride;
    a.num_kv_heads = KH;
    a.head_dim = d;
    a.rope = (*dev_rope)->view();
    a.k_pool = reinterpret_cast<__nv_bfloat16*>(dk.get());
    a.v_pool = reinterpret_cast<__nv_bfloat16*>(dv.get());
    ASSERT_TRUE(BlockCopyRerotate(a, nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

    std::vector<float> kf(k.size()), vf(v.size());
    for (size_t i = 0; i < k.size(); ++i) kf[i] = Bf16BitsToFloat(k[i]), vf[i] = Bf16BitsToFloat(v[i]);
    BlockCopyRerotateCpu(copies.data(), int(copies.size()), layers, layer_stride, shape, rope,
                         kf.data(), vf.data());
    const std::vector<uint16_t> gk = dk.Download(), gv = dv.Download();
    for (size_t i = 0; i < kf.size(); ++i) {
      const float g = Bf16BitsToFloat(gk[i]);
      ASSERT_LE(std::fabs(g - kf[i]), std::ldexp(std::fabs(kf[i]), -8) + 1e-6f)
          << "d " << d << " k element " << i;
      ASSERT_EQ(Bf16BitsToFloat(gv[i]), vf[i]) << "d " << d << " v element " << i;
    }
  }
}

}  // namespace
}  // namespace lazyattn
