// Linear layers over weights kept in their stored form (CPU): fp32, fp16, bf16, and ggml's Q8_0,
// Q4_0 and Q4_1 blocks, so that a decode step reads ~4-8x fewer weight bytes than with fp32.
//
// Layout: a matrix is `rows` output features of `cols` inputs, row-major, each row
// WeightTypeRowBytes(type, cols) bytes, rows back to back (ggml's block layout, as in GGUF).
// Q8_0: 32 values a block, fp16 scale d + 32 int8 q; x = d q.
// Q4_0: fp16 d + 16 bytes; byte j holds value j (low nibble) and j + 16 (high); x = d (q - 8).
// Q4_1: fp16 d, fp16 m + 16 bytes as Q4_0; x = d q + m.
//
// Numerics of the fused dot products (few rows, decode), per CpuActivations:
// - kInt8 (the default, engine.cpu_activations: int8): for Q8_0 / Q4_0 / Q4_1 weights each
//   activation row is quantized per 32-value block as ggml does (q8_0, or q8_1 with its block sum
//   for Q4_1; fp16 scale d = max|x| / 127, q = round(x / d)) and each block multiplies int8 by
//   int8 / uint4 into an exact int32 sum, blocks accumulating in fp32 (llama.cpp's CPU path).
//   Per value the activation moves by at most amax / 254 + amax * 2^-11 (the fp16 scale's
//   rounding) while the scale amax / 127 is a normal fp16 (amax >= ~7.8e-3); below that the
//   scale's absolute rounding (up to 2^-25) dominates, and a block with amax under ~3.8e-6 gets
//   scale 0 and becomes zeros, as in ggml. SmolLM2's first-step logits, where only the LM head
//   takes this path, move by up to ~0.4 against fp32 activations, and greedy tokens can part
//   from the fp32 ones at near-ties (tests/golden/golden_generation_test.cc asserts both,
//   docs/benchmarks.md lists the partings). A row holding an inf, a NaN or a value too large
//   for the fp16 scale keeps fp32 activations.
// - kFp32: activations stay fp32 and every product accumulates in fp32; a block's values are
//   summed as d * sum(q x) (+ m * sum(x)), which differs from multiplying dequantized weights only
//   in rounding (the golden tests' 1e-3 logit tolerance holds with room to spare).
// F32 / F16 / BF16 weights, and the many-row path, use fp32 activations in both modes. The path is
// chosen per product by its row count (the whole step's rows in the engine), so with kInt8 a
// request's logits depend on what shares its steps: a short prompt chunk takes int8, a decode
// row beside more than 8 other rows takes fp32. kFp32 is the batch-independent choice.
//
// Instruction sets: each kernel has a portable version (the reference the others are tested
// against) and SIMD ones: AVX2+FMA+F16C, and for the int8 products AVX-512 BW and AVX-512 VNNI
// (the fp32 products take AVX2 there); the best one the CPU runs is picked once at run time.
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

// Kernel variants, each a superset of the one before. kAuto: the best one the CPU supports
// (CpuKernelIsa()). The AVX-512 ones differ from kAvx2 only in the int8 products.
enum class CpuIsa : uint8_t { kAuto, kPortable, kAvx2, kAvx512Bw, kAvx512Vnni };
std::string_view CpuIsaName(CpuIsa isa);
// The variant kAuto resolves to on this CPU: AVX2 needs AVX2, FMA and F16C; kAvx512Bw adds
// AVX-512 F and BW; kAvx512Vnni adds AVX-512 VNNI.
CpuIsa CpuKernelIsa();
// Whether this CPU runs `isa`'s kernels (kPortable and kAuto always).
bool CpuSupportsIsa(CpuIsa isa);

// Activation precision of the fused dot products (see Numerics above). kConfigured: the
// process-wide setting (SetCpuActivations; kInt8 until set).
enum class CpuActivations : uint8_t { kConfigured, kInt8, kFp32 };
std::string_view CpuActivationsName(CpuActivations a);  // "configured", "int8", "fp32"
// "int8" -> kInt8, "fp32" -> kFp32; false for anything else (kConfigured included).
bool ParseCpuActivations(std::string_view name, CpuActivations* out);
// Sets the process-wide precision (engine.cpu_activations / --cpu-activations); kConfigured
// restores the default, kInt8. Safe to call at any time: a product in flight keeps the value it
// read.
void SetCpuActivations(CpuActivations a);
// The process-wide precision: kInt8 or kFp32.
CpuActivations ConfiguredCpuActivations();

// y[r][j] = sum_k x[r][k] * W[j][k] for r < rows, j < w.rows (+ y[r][j] when accumulate); x has
// row stride w.cols, y row stride ldy >= w.rows. Few rows (decode) run the fused dot products,
// output features split over the kernel threads (cpu_threads.h); many rows (prefill) dequantize
// tiles of W into fp32 and multiply them with OpenBLAS. `activations` applies to the fused dot
// products only. Preconditions: the view is valid; isa is supported (CpuSupportsIsa).
void QuantLinearCpu(const float* x, int64_t rows, const QuantMatrixView& w, float* y, int64_t ldy,
                    bool accumulate = false, CpuIsa isa = CpuIsa::kAuto,
                    CpuActivations activations = CpuActivations::kConfigured);

// Converts rows [first, first + n) of `w` into fp32 at dst ([n][w.cols]): ggml's formulas, the
// same bits on every variant (the fingerprints hash them).
void DequantizeRowsCpu(const QuantMatrixView& w, int64_t first, int64_t n, float* dst,
                       CpuIsa isa = CpuIsa::kAuto);

// Rows with at most this many activation rows take the fused dot products; more take the
// dequantize-and-GEMM path (measured on SmolLM2-135M, 2 cores: docs/worker.md).
inline constexpr int64_t kQuantLinearDotMaxRows = 8;

}  // namespace lazyattn

#endif  // LAZYATTN_KERNELS_INCLUDE_QUANT_LINEAR_H_
