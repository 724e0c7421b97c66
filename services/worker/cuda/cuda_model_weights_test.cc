// The GPU's GGUF dequantization against the host's: bf16 values equal bit for bit.
#include <cuda_runtime_api.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "services/worker/cuda/cuda_model_weights.h"
#include "services/worker/cuda/gguf_dequantize.h"
#include "services/worker/model/ggml_type.h"
#include "services/worker/model/model_weights.h"

namespace lazyattn {
namespace {

using testing::DeviceBuffer;
using testing::FloatToBf16Bits;

// Random bytes of `rows` x `cols` values of `type`, every value finite: plain types from
// Normal(0, 1) (and a few subnormal halves), quantized blocks with random nibbles/bytes and
// random finite half scales.
std::vector<uint8_t> RandomTensor(GgmlType type, int64_t rows, int64_t cols, std::mt19937& rng) {
  const size_t bytes = *GgmlRowBytes(type, rows * cols);
  std::vector<uint8_t> out(bytes);
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : out) b = static_cast<uint8_t>(byte(rng));
  std::normal_distribution<float> normal(0, 1);
  auto put16 = [&](size_t at, uint16_t v) { std::memcpy(&out[at], &v, 2); };
  // Finite halves: exponent field below 31 (random bytes may also give subnormals).
  auto finite_half = [&] { return static_cast<uint16_t>(byte(rng) | (byte(rng) << 8)) & 0xBBFF; };
  switch (type) {
    case GgmlType::kF32:
      for (int64_t i = 0; i < rows * cols; ++i) {
        const float v = normal(rng);
        std::memcpy(&out[4 * i], &v, 4);
      }
      break;
    case GgmlType::kF16:
      for (int64_t i = 0; i < rows * cols; ++i) put16(2 * i, finite_half());
      break;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < rows * cols; ++i) put16(2 * i, FloatToBf16Bits(normal(rng)));
      break;
    case GgmlType::kQ8_0:
      for (size_t b = 0; b < bytes; b += 34) put16(b, finite_half());
      break;
    case GgmlType::kQ4_0:
      for (size_t b = 0; b < bytes; b += 18) put16(b, finite_half());
      break;
    case GgmlType::kQ4_1:
      for (size_t b = 0; b < bytes; b += 20) put16(b, finite_half()), put16(b + 2, finite_half());
      break;
    default:
      ADD_FAILURE() << "no generator for " << GgmlTypeName(type);
  }
  return out;
}

// Against DequantizeToF32, UnpermuteGgufRopeRows and round-to-nearest-even on the host, with
// and without the RoPE row order, for every type the GPU converts; fresh bytes every run.
TEST(DequantizeGgufToBf16Test, MatchesTheHostBitForBit) {
  SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int64_t rows = 2 * 64, cols = 96;  // two heads of 64 rows
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0,
                        GgmlType::kQ4_0, GgmlType::kQ4_1}) {
    for (int rope_head_dim : {0, 64}) {
      SCOPED_TRACE(::testing::Message() << GgmlTypeName(type) << " rope " << rope_head_dim);
      const auto bytes = RandomTensor(type, rows, cols, rng);
      std::vector<float> want(rows * cols);
      ASSERT_TRUE(DequantizeToF32(type, bytes.data(), rows * cols, want.data()).ok());
      if (rope_head_dim > 0) UnpermuteGgufRopeRows(want.data(), rows / 64, 64, cols);
      DeviceBuffer<uint8_t> src;
      src.Upload(bytes);
      DeviceBuffer<uint16_t> dst(rows * cols);
      dst.Poison();
      const absl::Status st = DequantizeGgufToBf16(
          static_cast<uint32_t>(type), src.get(), rows, cols, rope_head_dim,
          reinterpret_cast<__nv_bfloat16*>(dst.get()), nullptr);
      ASSERT_TRUE(st.ok()) << st;
      CUDA_ASSERT(cudaDeviceSynchronize());
      const auto got = dst.Download();
      for (int64_t i = 0; i < rows * cols; ++i) {
        ASSERT_EQ(got[i], FloatToBf16Bits(want[i])) << "element " << i << " (row " << i / cols
                                                    << "), host value " << want[i];
      }
    }
  }
  EXPECT_EQ(DequantizeGgufToBf16(static_cast<uint32_t>(GgmlType::kQ6_K), nullptr, 1, 256, 0,
                                 nullptr, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DequantizeGgufToBf16(kGgufQ4_0, nullptr, 1, 48, 0, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);  // not whole blocks
}

// The whole GGUF loader against the host loader, through LoadGgufModelToGpu (which calls
// LoadGguf): cuda_model_loader_test.cc.

TEST(CudaModelWeightsTest, GgufErrorsNameTheFile) {
  SKIP_WITHOUT_GPU();
  auto missing = CudaModelWeights::LoadGguf("/nonexistent/model.gguf");
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/model.gguf"), std::string::npos);
}

}  // namespace
}  // namespace lazyattn
