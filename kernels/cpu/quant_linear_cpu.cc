#include <cblas.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "kernels/cpu/quant_dot.h"
#include "kernels/cpu/quant_int8.h"
#include "kernels/include/cpu_threads.h"
#include "kernels/include/quant_linear.h"

namespace lazyattn {
namespace {

using quant_internal::DotArgs;
using quant_internal::kBlock;

// Output features per task of the fused dot products: enough to amortize the task, small enough
// to balance two to a few dozen threads on the narrowest matrices (576 outputs).
constexpr int64_t kDotGrain = 16;
// Output features dequantized per GEMM of the prefill path, at most: OpenBLAS's blocking wants
// wide products (128-row tiles ran 10% slower on SmolLM2's layers), and a [512][576] fp32 tile
// is 1.2 MB of scratch a thread.
constexpr int64_t kTileRows = 512;
// Output features per thread of the GEMM path, at least: narrower slices lose OpenBLAS efficiency.
constexpr int64_t kGemmGrain = 32;

std::atomic<CpuActivations> g_activations{CpuActivations::kInt8};

// The fp32-activation kernels exist in portable and AVX2 forms; the AVX-512 levels include AVX2.
void DotRows(CpuIsa isa, const DotArgs& a) {
  if (isa >= CpuIsa::kAvx2) {
    quant_internal::DotRowsAvx2(a);
  } else {
    quant_internal::DotRowsPortable(a);
  }
}

void DotRowsInt8(CpuIsa isa, const quant_internal::Int8DotArgs& a) {
  switch (isa) {
    case CpuIsa::kAvx512Vnni:
      return quant_internal::DotRowsInt8Avx512Vnni(a);
    case CpuIsa::kAvx512Bw:
      return quant_internal::DotRowsInt8Avx512Bw(a);
    case CpuIsa::kAvx2:
      return quant_internal::DotRowsInt8Avx2(a);
    default:
      return quant_internal::DotRowsInt8Portable(a);
  }
}

CpuIsa Resolve(CpuIsa isa) { return isa == CpuIsa::kAuto ? CpuKernelIsa() : isa; }

// Quantized activation rows, reused across products on the calling thread (a decode step runs a
// few hundred products; the pool's threads only read them while the caller waits).
struct Q8Rows {
  std::vector<int8_t> qs;
  std::vector<float> d, s;
  std::vector<int32_t> qsum;
  void Resize(int64_t rows, int64_t blocks) {
    qs.resize(rows * blocks * kBlock);
    d.resize(rows * blocks);
    s.resize(rows * blocks);
    qsum.resize(rows * blocks);
  }
  quant_internal::Q8Row Row(int64_t r, int64_t blocks) {
    return {qs.data() + r * blocks * kBlock, d.data() + r * blocks, s.data() + r * blocks,
            qsum.data() + r * blocks};
  }
};

void FusedDots(const float* x, int64_t rows, const QuantMatrixView& w, float* y, int64_t ldy,
               bool accumulate, CpuIsa isa, CpuActivations activations) {
  const size_t row_bytes = WeightTypeRowBytes(w.type, w.cols);
  const int64_t blocks = w.cols / kBlock;
  // int8 rows: quantized per block; a row the quantizer refuses (inf, NaN, a scale past fp16)
  // stays fp32.
  // A named reference: inside the pool's lambdas a thread_local's name would mean the pool
  // thread's own (empty) copy.
  thread_local Q8Rows q8_storage;
  Q8Rows& q8 = q8_storage;
  std::vector<char> int8_row(rows, 0);
  if (activations == CpuActivations::kInt8 && quant_internal::HasInt8Dot(w.type)) {
    q8.Resize(rows, blocks);
    for (int64_t r = 0; r < rows; ++r) {
      int8_row[r] = quant_internal::QuantizeRowQ8(x + r * w.cols, blocks,
                                                  w.type == WeightType::kQ4_1, q8.Row(r, blocks));
    }
  }
  // fp32 rows: their sum over each block (Q4_0 / Q4_1 fold their offset into it).
  std::vector<float> sums;
  const bool needs_sums = w.type == WeightType::kQ4_0 || w.type == WeightType::kQ4_1;
  if (needs_sums) {
    sums.resize(rows * blocks);
    for (int64_t r = 0; r < rows; ++r) {
      if (int8_row[r]) continue;
      for (int64_t b = 0; b < blocks; ++b) {
        const float* xb = x + r * w.cols + b * kBlock;
        float s = 0;
        for (int i = 0; i < kBlock; ++i) s += xb[i];
        sums[r * blocks + b] = s;
      }
    }
  }
  // Small products (the tiny models, short attention products) stay on this thread.
  const int64_t grain = CpuWorkGrain(w.rows, kDotGrain, rows * w.cols);
  CpuParallelFor(w.rows, grain, [&](int64_t begin, int64_t end) {
    // Each weight row range is read from memory once; the rows of x reuse it from cache.
    for (int64_t r = 0; r < rows; ++r) {
      if (int8_row[r]) {
        const quant_internal::Q8Row xr = q8.Row(r, blocks);
        DotRowsInt8(isa, {.type = w.type,
                          .w = w.data + begin * row_bytes,
                          .row_bytes = row_bytes,
                          .n = end - begin,
                          .blocks = blocks,
                          .xq = xr.qs,
                          .xd = xr.d,
                          .xs = xr.s,
                          .xqsum = xr.qsum,
                          .y = y + r * ldy + begin,
                          .accumulate = accumulate});
        continue;
      }
      DotRows(isa, {.type = w.type,
                    .w = w.data + begin * row_bytes,
                    .row_bytes = row_bytes,
                    .n = end - begin,
                    .cols = w.cols,
                    .x = x + r * w.cols,
                    .x_block_sums = needs_sums ? sums.data() + r * blocks : nullptr,
                    .y = y + r * ldy + begin,
                    .accumulate = accumulate});
    }
  });
}

// Output features split over the kernel threads; each thread dequantizes its features a tile at a
// time and multiplies the tile with single-threaded OpenBLAS (cpu_threads.h keeps OpenBLAS at one
// thread: its own pool would compete with ours for the cores).
void TiledGemm(const float* x, int64_t rows, const QuantMatrixView& w, float* y, int64_t ldy,
               bool accumulate) {
  const float beta = accumulate ? 1.0f : 0.0f;
  const int64_t grain = CpuWorkGrain(w.rows, kGemmGrain, rows * w.cols);
  CpuParallelFor(w.rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> tile;
    if (w.type != WeightType::kF32) tile.resize(std::min(kTileRows, end - begin) * w.cols);
    for (int64_t first = begin; first < end; first += kTileRows) {
      const int64_t n = std::min(kTileRows, end - first);
      const float* b = reinterpret_cast<const float*>(w.data) + first * w.cols;
      if (w.type != WeightType::kF32) {
        DequantizeRowsCpu(w, first, n, tile.data());
        b = tile.data();
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, n, w.cols, 1.0f, x, w.cols, b,
                  w.cols, beta, y + first, ldy);
    }
  });
}

}  // namespace

std::string_view WeightTypeName(WeightType type) {
  switch (type) {
    case WeightType::kF32:
      return "F32";
    case WeightType::kF16:
      return "F16";
    case WeightType::kBF16:
      return "BF16";
    case WeightType::kQ8_0:
      return "Q8_0";
    case WeightType::kQ4_0:
      return "Q4_0";
    case WeightType::kQ4_1:
      return "Q4_1";
  }
  return "?";
}

int64_t WeightTypeBlockValues(WeightType type) {
  switch (type) {
    case WeightType::kQ8_0:
    case WeightType::kQ4_0:
    case WeightType::kQ4_1:
      return kBlock;
    default:
      return 1;
  }
}

size_t WeightTypeRowBytes(WeightType type, int64_t cols) {
  switch (type) {
    case WeightType::kF32:
      return 4 * cols;
    case WeightType::kF16:
    case WeightType::kBF16:
      return 2 * cols;
    case WeightType::kQ8_0:
      return cols / kBlock * 34;
    case WeightType::kQ4_0:
      return cols / kBlock * 18;
    case WeightType::kQ4_1:
      return cols / kBlock * 20;
  }
  return 0;
}

std::string_view CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto:
      return "auto";
    case CpuIsa::kPortable:
      return "portable";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512Bw:
      return "avx512bw";
    case CpuIsa::kAvx512Vnni:
      return "avx512vnni";
  }
  return "?";
}

std::string_view CpuActivationsName(CpuActivations a) {
  switch (a) {
    case CpuActivations::kConfigured:
      return "configured";
    case CpuActivations::kInt8:
      return "int8";
    case CpuActivations::kFp32:
      return "fp32";
  }
  return "?";
}

bool ParseCpuActivations(std::string_view name, CpuActivations* out) {
  if (name == "int8") {
    *out = CpuActivations::kInt8;
  } else if (name == "fp32") {
    *out = CpuActivations::kFp32;
  } else {
    return false;
  }
  return true;
}

void SetCpuActivations(CpuActivations a) {
  g_activations.store(a == CpuActivations::kConfigured ? CpuActivations::kInt8 : a,
                      std::memory_order_relaxed);
}

CpuActivations ConfiguredCpuActivations() {
  return g_activations.load(std::memory_order_relaxed);
}

#if defined(__x86_64__) || defined(__i386__)
namespace {
bool CpuHasF16c() {
  unsigned int eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}
}  // namespace
#endif

bool CpuSupportsIsa(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto:
    case CpuIsa::kPortable:
      return true;
    case CpuIsa::kAvx2:
#if defined(__x86_64__) || defined(__i386__)
      // F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports knows no "f16c".
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && CpuHasF16c();
#else
      return false;
#endif
    case CpuIsa::kAvx512Bw:
#if defined(__x86_64__) || defined(__i386__)
      // The runtime checks include the OS's saving of the AVX-512 state (XCR0).
      return CpuSupportsIsa(CpuIsa::kAvx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw");
#else
      return false;
#endif
    case CpuIsa::kAvx512Vnni:
#if defined(__x86_64__) || defined(__i386__)
      return CpuSupportsIsa(CpuIsa::kAvx512Bw) && __builtin_cpu_supports("avx512vnni");
#else
      return false;
#endif
  }
  return false;
}

CpuIsa CpuKernelIsa() {
  static const CpuIsa isa = [] {
    for (const CpuIsa best : {CpuIsa::kAvx512Vnni, CpuIsa::kAvx512Bw, CpuIsa::kAvx2}) {
      if (CpuSupportsIsa(best)) return best;
    }
    return CpuIsa::kPortable;
  }();
  return isa;
}

void DequantizeRowsCpu(const QuantMatrixView& w, int64_t first, int64_t n, float* dst, CpuIsa isa) {
  const size_t row_bytes = WeightTypeRowBytes(w.type, w.cols);
  const uint8_t* src = w.data + first * row_bytes;
  const int64_t count = n * w.cols;
  if (Resolve(isa) >= CpuIsa::kAvx2 && quant_internal::DequantizeAvx2(w.type, src, count, dst)) {
    return;
  }
  auto half = [](const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, sizeof h);
    return h;
  };
  switch (w.type) {
    case WeightType::kF32:
      std::memcpy(dst, src, count * sizeof(float));
      return;
    case WeightType::kF16:
      for (int64_t i = 0; i < count; ++i)
        dst[i] = quant_internal::HalfBitsToFloat(half(src + 2 * i));
      return;
    case WeightType::kBF16:
      for (int64_t i = 0; i < count; ++i)
        dst[i] = quant_internal::Bf16BitsToFloat(half(src + 2 * i));
      return;
    case WeightType::kQ8_0:
      for (int64_t b = 0; b < count / kBlock; ++b) {
        const uint8_t* blk = src + b * 34;
        const float d = quant_internal::HalfBitsToFloat(half(blk));
        for (int i = 0; i < kBlock; ++i) {
          dst[b * kBlock + i] = d * static_cast<float>(static_cast<int8_t>(blk[2 + i]));
        }
      }
      return;
    case WeightType::kQ4_0:
    case WeightType::kQ4_1: {
      const bool q41 = w.type == WeightType::kQ4_1;
      const size_t block_bytes = q41 ? 20 : 18, qs = q41 ? 4 : 2;
      for (int64_t b = 0; b < count / kBlock; ++b) {
        const uint8_t* blk = src + b * block_bytes;
        const float d = quant_internal::HalfBitsToFloat(half(blk));
        // ggml's formulas, rounding and the sign of zero included: d q + m, and d (q - 8).
        float* out = dst + b * kBlock;
        if (q41) {
          const float m = quant_internal::HalfBitsToFloat(half(blk + 2));
          for (int j = 0; j < 16; ++j) {
            out[j] = d * static_cast<float>(blk[qs + j] & 0x0F) + m;
            out[j + 16] = d * static_cast<float>(blk[qs + j] >> 4) + m;
          }
        } else {
          for (int j = 0; j < 16; ++j) {
            out[j] = d * static_cast<float>((blk[qs + j] & 0x0F) - 8);
            out[j + 16] = d * static_cast<float>((blk[qs + j] >> 4) - 8);
          }
        }
      }
      return;
    }
  }
}

void QuantLinearCpu(const float* x, int64_t rows, const QuantMatrixView& w, float* y, int64_t ldy,
                    bool accumulate, CpuIsa isa, CpuActivations activations) {
  if (rows <= 0 || w.rows <= 0) return;
  if (rows <= kQuantLinearDotMaxRows) {
    if (activations == CpuActivations::kConfigured) activations = ConfiguredCpuActivations();
    FusedDots(x, rows, w, y, ldy, accumulate, Resolve(isa), activations);
  } else {
    TiledGemm(x, rows, w, y, ldy, accumulate);
  }
}

}  // namespace lazyattn
