// Helpers for the CUDA kernel tests (test-only, header-only): device buffers, bf16 rounding on
// the host, poisoning, and the comparison every kernel test states its tolerance with.
#ifndef LAZYATTN_KERNELS_CUDA_CUDA_TEST_UTIL_H_
#define LAZYATTN_KERNELS_CUDA_CUDA_TEST_UTIL_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/device_info.h"

namespace lazyattn::testing {

#define SKIP_WITHOUT_GPU()                                                           \
  do {                                                                               \
    if (::lazyattn::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible"; \
  } while (0)

#define CUDA_ASSERT(call) ASSERT_EQ((call), cudaSuccess) << #call

inline uint16_t FloatToBf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);                    // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}
inline float Bf16BitsToFloat(uint16_t h) {
  const uint32_t u = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float RoundBf16(float f) { return Bf16BitsToFloat(FloatToBf16Bits(f)); }
inline constexpr uint16_t kBf16NaN = 0x7fc0;

// n bf16 values drawn from Normal(0, scale), as raw bits.
inline std::vector<uint16_t> RandomBf16(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> normal(0, scale);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = FloatToBf16Bits(normal(rng));
  return v;
}
inline std::vector<float> Bf16ToFloats(const std::vector<uint16_t>& b) {
  std::vector<float> f(b.size());
  for (size_t i = 0; i < b.size(); ++i) f[i] = Bf16BitsToFloat(b[i]);
  return f;
}

// Fresh seed per run (printed on failure through SCOPED_TRACE by callers), or the one in
// LAZYATTN_TEST_SEED, so a failure's seed can be replayed.
inline uint32_t FreshSeed() {
  if (const char* fixed = std::getenv("LAZYATTN_TEST_SEED"); fixed != nullptr && *fixed != '\0') {
    return static_cast<uint32_t>(std::strtoul(fixed, nullptr, 10));
  }
  return std::random_device{}();
}

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) { Resize(n); }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void Resize(size_t n) {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
    n_ = n;
    if (n > 0 && cudaMalloc(reinterpret_cast<void**>(&ptr_), n * sizeof(T)) != cudaSuccess) {
      ptr_ = nullptr;
      ADD_FAILURE() << "cudaMalloc of " << n * sizeof(T) << " bytes failed";
    }
  }
  void Upload(const std::vector<T>& h) {
    Resize(h.size());
    if (!h.empty()) {
      EXPECT_EQ(cudaMemcpy(ptr_, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice),
                cudaSuccess);
    }
  }
  std::vector<T> Download() const {
    std::vector<T> h(n_);
    if (n_ > 0) {
      EXPECT_EQ(cudaMemcpy(h.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return h;
  }
  void Poison() {  // 0xff bytes: NaN for fp32 and bf16, -1 for integers
    if (n_ > 0) {
      EXPECT_EQ(cudaMemset(ptr_, 0xff, n_ * sizeof(T)), cudaSuccess);
    }
  }
  T* get() const { return ptr_; }
  size_t size() const { return n_; }

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

// A buffer of bf16 bits as the kernels' bf16 pointer.
inline const __nv_bfloat16* AsBf16(const DeviceBuffer<uint16_t>& b) {
  return reinterpret_cast<const __nv_bfloat16*>(b.get());
}
// The same, for a kernel's output.
inline __nv_bfloat16* AsMutableBf16(DeviceBuffer<uint16_t>& b) {
  return reinterpret_cast<__nv_bfloat16*>(b.get());
}

// Every element must satisfy |got - want| <= abs_tol + rel_tol * |want| (NaN never passes), and
// ||got - want|| / ||want|| <= rel_l2. Returns a failure naming the first bad element.
struct Tolerance {
  double abs_tol;
  double rel_tol;
  double rel_l2;
};

inline ::testing::AssertionResult AllClose(const std::vector<float>& got,
                                           const std::vector<float>& want, Tolerance tol,
                                           double* rel_l2_out = nullptr,
                                           double* max_abs_out = nullptr) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "size " << got.size() << " != " << want.size();
  }
  double diff2 = 0, ref2 = 0, max_abs = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(double(got[i]) - double(want[i]));
    if (!(d <= tol.abs_tol + tol.rel_tol * std::fabs(want[i]))) {
      return ::testing::AssertionFailure()
             << "element " << i << ": got " << got[i] << ", want " << want[i] << " (|diff| "
             << d << " > " << tol.abs_tol << " + " << tol.rel_tol << " * |want|)";
    }
    diff2 += d * d;
    ref2 += double(want[i]) * want[i];
    max_abs = std::max(max_abs, d);
  }
  const double rel = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  if (rel_l2_out) *rel_l2_out = rel;
  if (max_abs_out) *max_abs_out = max_abs;
  if (!(rel <= tol.rel_l2)) {
    return ::testing::AssertionFailure() << "relative L2 error " << rel << " > " << tol.rel_l2;
  }
  return ::testing::AssertionSuccess();
}

inline double Rms(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += double(x) * x;
  return v.empty() ? 0 : std::sqrt(s / v.size());
}

}  // namespace lazyattn::testing

#endif  // LAZYATTN_KERNELS_CUDA_CUDA_TEST_UTIL_H_
