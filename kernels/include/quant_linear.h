// Linear layers over weights kept in their stored form (CPU): fp32, fp16, bf16, and ggml's Q8_0,
// Q4_0 and Q4_1 blocks, so that a decode step reads ~4-8x fewer weight bytes than with fp32.
//
// Layout: a matrix is `rows` output features of `cols` inputs, row-major, each row
// WeightTypeRowBytes(type, cols) bytes, rows back to back (ggml's block layout, as in GGUF).
// Q8_0: 32 values a block, fp16 scale d + 32 int8 q; x = d q.
// Q4_0: fp16 d + 16 bytes; byte j holds value j (low nibble) and j + 16 (high); x = d (q - 8).
// Q4_1: fp16 d, fp16 m + 16 bytes as Q4_0; x = d q + m.
//
// Numerics: activations stay fp32 and every product accumulates in fp32; a block's values are
// summed as d * sum(q x) (+ m * sum(x)), which differs from multiplying dequantized weights only in
// rounding (the golden tests' 1e-3 logit tolerance holds with room to spare).
//
// Instruction sets: each kernel has a portable version (the reference the others are tested
// against) and an AVX2+FMA+F16C one; the best one the CPU runs is picked once at run time.
#ifndef LAZYATTN_KERNELS_INCLUDE_QUANT_LINEAR_H_
#define LAZYATTN_KERNELS_INCLUDE_QUANT_LINEAR_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace lazyattn {

enum class WeightType : uint8_t { kF32, kF16, kBF16, kQ8_0, kQ4_0, kQ4_1 };

std::string_view WeightTypeName(WeightType type);

// Values a block holds (1 for the float types); `cols` must be a multiple of it.
int64_t WeightTypeBlockValues(WeightType type);
// Bytes of one row of `cols` values. Precondition: cols % WeightTypeBlockValues(type) == 0.
size_t WeightTypeRowBytes(WeightType type, int64_t cols);

// A read-only view of one matrix (see the layout above).
struct QuantMatrixView {
  WeightType type = WeightType::kF32;
  const uint8_t* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
};

// Kernel variants. kAuto: the best one the CPU supports (CpuKernelIsa()).
enum class CpuIsa : uint8_t { kAuto, kPortable, kAvx2 };
std::string_view CpuIsaName(CpuIsa isa);
// The variant kAuto resolves to on this CPU (AVX2 needs AVX2, FMA and F16C).
CpuIsa CpuKernelIsa();
// Whether this CPU runs `isa`'s kernels (kPortable and kAuto always).
bool CpuSupportsIsa(CpuIsa isa);

// y[r][j] = sum_k x[r][k] * W[j][k] for r < rows, j < w.rows (+ y[r][j] when accumulate); x has
// row stride w.cols, y row stride ldy >= w.rows. Few rows (decode) run the fused dot products,
// output features split over the kernel threads (cpu_threads.h); many rows (prefill) dequantize
// tiles of W into fp32 and multiply them with OpenBLAS. Preconditions: the view is valid; isa is
// supported (CpuSupportsIsa).
void QuantLinearCpu(const float* x, int64_t rows, const QuantMatrixView& w, float* y, int64_t ldy,
                    bool accumulate = false, CpuIsa isa = CpuIsa::kAuto);

// Converts rows [first, first + n) of `w` into fp32 at dst ([n][w.cols]): ggml's formulas, the
// same bits on every variant (the fingerprints hash them).
void DequantizeRowsCpu(const QuantMatrixView& w, int64_t first, int64_t n, float* dst,
                       CpuIsa isa = CpuIsa::kAuto);

// Rows with at most this many activation rows take the fused dot products; more take the
// dequantize-and-GEMM path (measured on SmolLM2-135M, 2 cores: docs/worker.md).
inline constexpr int64_t kQuantLinearDotMaxRows = 8;

}  // namespace lazyattn

#endif  // LAZYATTN_KERNELS_INCLUDE_QUANT_LINEAR_H_
