#include "kernels/cuda/rope_kv_append.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/include/paged_attention.h"
#include "kernels/include/rope.h"

namespace lazyattn {
namespace {

using testing::Bf16BitsToFloat;
using testing::DeviceBuffer;
using testing::FloatToBf16Bits;

// Arguments over one fused QKV buffer ([n][(H + 2 KH) d], device bf16 bits) writing q_out and the
// pools; a test may point q and k elsewhere with their own strides.
RopeKvAppendArgs FusedQkvArgs(const uint16_t* qkv, int n, int H, int KH, int d,
                              const int32_t* local, const int32_t* delta, const int64_t* slots,
                              const RopeTableView& rope, uint16_t* q_out, uint16_t* k_pool,
                              uint16_t* v_pool) {
  RopeKvAppendArgs a;
  auto* base = reinterpret_cast<const __nv_bfloat16*>(qkv);
  a.q = base;
  a.k = base + H * d;
  a.v = base + (H + KH) * d;
  a.q_row_stride = a.k_row_stride = a.v_row_stride = (H + 2 * KH) * d;
  a.num_tokens = n;
  a.num_heads = H;
  a.num_kv_heads = KH;
  a.head_dim = d;
  a.local_positions = local;
  a.deltas = delta;
  a.slots = slots;
  a.rope = rope;
  a.q_out = reinterpret_cast<__nv_bfloat16*>(q_out);
  a.k_pool = reinterpret_cast<__nv_bfloat16*>(k_pool);
  a.v_pool = reinterpret_cast<__nv_bfloat16*>(v_pool);
  return a;
}

// q and k come from one fused QKV row ([n][(H + 2 KH) d]); the kernel rotates q at delta + local
// and k at local, and writes k and v into shuffled slots. Reference: RopeApplyCpu +
// PagedKvWriteCpu on the same bf16 inputs. Tolerance: one bf16 rounding of a value computed in
// fp32 from the same fp32 cos/sin: |got - want| <= 2^-8 |want| + 1e-6 per element; V bit-exact.
TEST(RopeKvAppendTest, MatchesCpuTwinOnFusedQkv) {
  SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0, 1);
  // 12: V copied a value at a time (head_dim not a multiple of 8); 64 and 128 in 16-byte pieces.
  for (int d : {12, 64, 128}) {
    const int H = 8, KH = 2, n = 99, pool_blocks = 13;
    const int row = (H + 2 * KH) * d;
    RopeTable rope(RopeParams{.head_dim = d, .theta = 500000}, 220000);
    auto dev_rope = DeviceRopeTable::Create(rope);
    ASSERT_TRUE(dev_rope.ok()) << dev_rope.status();

    std::vector<uint16_t> qkv(size_t(n) * row);
    for (auto& x : qkv) x = FloatToBf16Bits(normal(rng));
    std::vector<int32_t> local(n), delta(n);
    std::vector<int64_t> slots(n);
    std::vector<int64_t> all_slots(pool_blocks * 16);
    for (int i = 0; i < pool_blocks * 16; ++i) all_slots[i] = i;
    std::shuffle(all_slots.begin(), all_slots.end(), rng);
    std::uniform_int_distribution<int> pos(0, 20000), off(0, 199999 - 20000);
    for (int t = 0; t < n; ++t) {
      local[t] = pos(rng);
      delta[t] = off(rng);
      slots[t] = t == 5 ? -1 : all_slots[t];  // token 5 is padding: no K/V write
    }
    const size_t pool = size_t(pool_blocks) * KH * 16 * d;
    DeviceBuffer<uint16_t> d_qkv, d_qout(size_t(n) * H * d), d_k(pool), d_v(pool);
    d_qkv.Upload(qkv);
    d_qout.Poison();
    d_k.Poison();
    d_v.Poison();
    DeviceBuffer<int32_t> d_local, d_delta;
    DeviceBuffer<int64_t> d_slots;
    d_local.Upload(local);
    d_delta.Upload(delta);
    d_slots.Upload(slots);

    const RopeKvAppendArgs a =
        FusedQkvArgs(d_qkv.get(), n, H, KH, d, d_local.get(), d_delta.get(), d_slots.get(),
                     (*dev_rope)->view(), d_qout.get(), d_k.get(), d_v.get());
    ASSERT_TRUE(RopeKvAppend(a, nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

    // CPU twin.
    std::vector<float> q(size_t(n) * H * d), k(size_t(n) * KH * d), v(size_t(n) * KH * d);
    for (int t = 0; t < n; ++t) {
      for (int i = 0; i < H * d; ++i) q[t * H * d + i] = Bf16BitsToFloat(qkv[size_t(t) * row + i]);
      for (int i = 0; i < KH * d; ++i) {
        k[t * KH * d + i] = Bf16BitsToFloat(qkv[size_t(t) * row + H * d + i]);
        v[t * KH * d + i] = Bf16BitsToFloat(qkv[size_t(t) * row + (H + KH) * d + i]);
      }
    }
    std::vector<int64_t> qpos(n), kpos(n);
    for (int t = 0; t < n; ++t) qpos[t] = int64_t(local[t]) + delta[t], kpos[t] = local[t];
    RopeApplyCpu(q.data(), n, H, qpos.data(), rope);
    RopeApplyCpu(k.data(), n, KH, kpos.data(), rope);
    PagedKvShape shape{.num_kv_heads = KH, .head_dim = d, .block_size = 16};
    std::vector<float> k_pool(pool, NAN), v_pool(pool, NAN);
    std::vector<int64_t> write_slots;
    std::vector<float> kw, vw;
    for (int t = 0; t < n; ++t) {
      if (slots[t] < 0) continue;
      write_slots.push_back(slots[t]);
      kw.insert(kw.end(), &k[t * KH * d], &k[(t + 1) * KH * d]);
      vw.insert(vw.end(), &v[t * KH * d], &v[(t + 1) * KH * d]);
    }
    PagedKvWriteCpu(kw.data(), vw.data(), int(write_slots.size()), write_slots.data(), shape,
                    k_pool.data(), v_pool.data());

    auto check = [](float got, float want) {
      return std::isnan(want) ? std::isnan(got)
                              : std::fabs(got - want) <= std::ldexp(std::fabs(want), -8) + 1e-6f;
    };
    const std::vector<uint16_t> gq = d_qout.Download(), gk = d_k.Download(), gv = d_v.Download();
    for (size_t i = 0; i < q.size(); ++i) {
      ASSERT_TRUE(check(Bf16BitsToFloat(gq[i]), q[i])) << "d " << d << " q element " << i;
    }
    for (size_t i = 0; i < pool; ++i) {
      ASSERT_TRUE(check(Bf16BitsToFloat(gk[i]), k_pool[i])) << "d " << d << " k element " << i;
      if (std::isnan(v_pool[i])) {
        ASSERT_TRUE(std::isnan(Bf16BitsToFloat(gv[i]))) << "v element " << i << " written";
      } else {
        ASSERT_EQ(Bf16BitsToFloat(gv[i]), v_pool[i]) << "d " << d << " v element " << i;
      }
    }
  }
}

// Where q's and k's rows are 16-byte aligned the kernel rotates 8 pairs a thread with vector
// loads, else one pair (rope_kv_append.cu); both must give the same bits. The same values are
// laid out once with aligned rows (stride (H + 2 KH) d) and once in separate q and k buffers
// whose rows are 2 values longer (unaligned), v shared.
TEST(RopeKvAppendTest, AlignedAndUnalignedRowsGiveTheSameBits) {
  SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0, 1);
  for (int d : {64, 128}) {
    const int H = 8, KH = 2, n = 40, pool_blocks = 3;
    const int row = (H + 2 * KH) * d, q_stride = H * d + 2, k_stride = KH * d + 2;
    RopeTable rope(RopeParams{.head_dim = d, .theta = 500000}, 70000);
    auto dev_rope = DeviceRopeTable::Create(rope);
    ASSERT_TRUE(dev_rope.ok()) << dev_rope.status();
    std::vector<uint16_t> qkv(size_t(n) * row), q(size_t(n) * q_stride), k(size_t(n) * k_stride);
    for (auto& x : qkv) x = FloatToBf16Bits(normal(rng));
    for (int t = 0; t < n; ++t) {
      for (int i = 0; i < H * d; ++i) q[size_t(t) * q_stride + i] = qkv[size_t(t) * row + i];
      for (int i = 0; i < KH * d; ++i) {
        k[size_t(t) * k_stride + i] = qkv[size_t(t) * row + H * d + i];
      }
    }
    std::vector<int32_t> local(n), delta(n);
    std::vector<int64_t> slots(n);
    for (int t = 0; t < n; ++t) {
      local[t] = int32_t(rng() % 30000);
      delta[t] = int32_t(rng() % 30000);
      slots[t] = t == 3 ? -1 : t;  // token 3 is padding: no K/V write in either form
    }
    DeviceBuffer<uint16_t> d_qkv, d_q, d_k;
    d_qkv.Upload(qkv);
    d_q.Upload(q);
    d_k.Upload(k);
    DeviceBuffer<int32_t> d_local, d_delta;
    DeviceBuffer<int64_t> d_slots;
    d_local.Upload(local);
    d_delta.Upload(delta);
    d_slots.Upload(slots);
    const size_t pool = size_t(pool_blocks) * KH * 16 * d;
    std::vector<std::vector<uint16_t>> q_out, k_out;
    for (bool aligned : {true, false}) {
      DeviceBuffer<uint16_t> d_qout(size_t(n) * H * d), d_kpool(pool), d_vpool(pool);
      d_qout.Poison();
      d_kpool.Poison();
      RopeKvAppendArgs a =
          FusedQkvArgs(d_qkv.get(), n, H, KH, d, d_local.get(), d_delta.get(), d_slots.get(),
                       (*dev_rope)->view(), d_qout.get(), d_kpool.get(), d_vpool.get());
      if (!aligned) {
        a.q = reinterpret_cast<const __nv_bfloat16*>(d_q.get());
        a.q_row_stride = q_stride;
        a.k = reinterpret_cast<const __nv_bfloat16*>(d_k.get());
        a.k_row_stride = k_stride;
      }
      ASSERT_TRUE(RopeKvAppend(a, nullptr).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      q_out.push_back(d_qout.Download());
      k_out.push_back(d_kpool.Download());
    }
    EXPECT_EQ(q_out[0], q_out[1]) << "d " << d;
    EXPECT_EQ(k_out[0], k_out[1]) << "d " << d;
    // Real rotations were compared: the outputs are not the inputs.
    EXPECT_NE(Bf16BitsToFloat(q_out[0][1]), Bf16BitsToFloat(qkv[1])) << "d " << d;
  }
}

}  // namespace
}  // namespace lazyattn
