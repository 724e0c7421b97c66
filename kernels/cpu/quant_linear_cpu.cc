#include <cblas.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/quant_dot.h"
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

void DotRows(CpuIsa isa, const DotArgs& a) {
  if (isa == CpuIsa::kAvx2) {
    quant_internal::DotRowsAvx2(a);
  } else {
    quant_internal::DotRowsPortable(a);
  }
}

CpuIsa Resolve(CpuIsa isa) { return isa == CpuIsa::kAuto ? CpuKernelIsa() : isa; }

void FusedDots(const float* x, int64_t rows, const QuantMatrixView& w, float* y, int64_t ldy,
               bool accumulate, CpuIsa isa) {
  const size_t row_bytes = WeightTypeRowBytes(w.type, w.cols);
  // Per activation row, its sum over each block (Q4_0 / Q4_1 fold their offset into it).
  std::vector<float> sums;
  const bool needs_sums = w.type == WeightType::kQ4_0 || w.type == WeightType::kQ4_1;
  const int64_t blocks = w.cols / kBlock;
  if (needs_sums) {
    sums.resize(rows * blocks);
    for (int64_t r = 0; r < rows; ++r) {
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
  }
  return "?";
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
  }
  return false;
}

CpuIsa CpuKernelIsa() {
  static const CpuIsa isa = CpuSupportsIsa(CpuIsa::kAvx2) ? CpuIsa::kAvx2 : CpuIsa::kPortable;
  return isa;
}

void DequantizeRowsCpu(const QuantMatrixView& w, int64_t first, int64_t n, float* dst, CpuIsa isa) {
  const size_t row_bytes = WeightTypeRowBytes(w.type, w.cols);
  const uint8_t* src = w.data + first * row_bytes;
  const int64_t count = n * w.cols;
  if (Resolve(isa) == CpuIsa::kAvx2 && quant_internal::DequantizeAvx2(w.type, src, count, dst)) {
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
                    bool accumulate, CpuIsa isa) {
  if (rows <= 0 || w.rows <= 0) return;
  if (rows <= kQuantLinearDotMaxRows) {
    FusedDots(x, rows, w, y, ldy, accumulate, Resolve(isa));
  } else {
    TiledGemm(x, rows, w, y, ldy, accumulate);
  }
}

}  // namespace lazyattn
