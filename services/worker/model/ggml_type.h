// ggml tensor types that can appear in GGUF files, and dequantization of the ones we support.
//
// Supported (dequantized to fp32 at load): F32, F16, BF16, Q8_0, Q4_0, Q4_1. Any other type that a
// file names is a clear error (Unimplemented naming the type), never a crash.
#ifndef LAZYATTN_SERVICES_WORKER_MODEL_GGML_TYPE_H_
#define LAZYATTN_SERVICES_WORKER_MODEL_GGML_TYPE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace lazyattn {

// Values are the on-disk ids of ggml's `enum ggml_type`.
enum class GgmlType : uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ8_1 = 9,
  kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kQ8_K = 15,
  kI8 = 24, kI16 = 25, kI32 = 26, kI64 = 27, kF64 = 28, kBF16 = 30,
};

// Name as ggml prints it ("Q4_1"), or "type<N>" for an id we do not know.
std::string_view GgmlTypeName(GgmlType type);

// Block geometry: `block_elements` values are stored in `block_bytes` bytes. NotFound/Unimplemented
// for ids we do not know the geometry of.
struct GgmlBlockLayout {
  int64_t block_elements;
  int64_t block_bytes;
};
absl::StatusOr<GgmlBlockLayout> GgmlLayout(GgmlType type);

// Bytes taken by `num_elements` values of `type`; InvalidArgument if not a whole number of blocks.
absl::StatusOr<size_t> GgmlRowBytes(GgmlType type, int64_t num_elements);

bool GgmlIsDequantizable(GgmlType type);

// Converts `num_elements` values stored as `type` at `src` into fp32 at `dst`.
// Precondition: `src` holds GgmlRowBytes(type, num_elements) bytes.
absl::Status DequantizeToF32(GgmlType type, const void* src, int64_t num_elements, float* dst);

// The first element of `num_elements` values stored as `type` at `src` that is NaN or +-Inf, and
// its value; nullopt when all are finite (and for the integer types, and ids of unknown layout).
// F32/F16/BF16/F64 test every element's exponent bits. Block types test the block's scale fields
// (d, and m/dmin/s where the type has one), which is complete: with finite fp16 scales every
// dequantized value is a scale times integers below 2^15 (sub-scale x quant), plus a scaled min,
// far below FLT_MAX; and a non-finite scale makes every value of its block non-finite (inf x 0 is
// NaN), so the first bad element is the first of the first bad block. Q8_K's scale is fp32, where d
// x q may overflow: its products are tested. For a block type DequantizeToF32 converts, `value` is
// that element's dequantized value; for the others, the block's non-finite scale. Precondition as
// DequantizeToF32: `src` holds GgmlRowBytes(type, num_elements) bytes.
struct NonFiniteElement {
  int64_t index;
  float value;
};
std::optional<NonFiniteElement> FindNonFinite(GgmlType type, const void* src, int64_t num_elements);

// The index of the first of `num_elements` fp32 values at `src` (any alignment) that is not finite
// once rounded to bfloat16, -1 when none: NaN, +-Inf, and finite values of magnitude 0x1.ff8p127
// (3.3961e38) or more, which round-to-nearest-even takes to infinity (bf16's largest is
// 0x1.fep127, 3.3895e38). The GPU backend keeps weights in bf16, so an fp32 weight that passes
// FindNonFinite may still become Inf there.
int64_t FirstNonFiniteAsBf16(const void* src, int64_t num_elements);

// Scalar conversions shared by the loaders (IEEE half and bfloat16).
float HalfToFloat(uint16_t h);
float Bf16ToFloat(uint16_t b);

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_MODEL_GGML_TYPE_H_
