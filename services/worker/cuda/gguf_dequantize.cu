#include "services/worker/cuda/gguf_dequantize.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"

namespace lazyattn {
namespace {

constexpr int kQK = 32;  // values per block of Q4_0, Q4_1, Q8_0

// Unaligned little-endian 16-bit load (GGUF aligns tensor starts only; Q8_0's 34-byte blocks put
// every other scale at an odd address).
__device__ __forceinline__ uint32_t LoadU16(const uint8_t* p) {
  return uint32_t{p[0]} | (uint32_t{p[1]} << 8);
}

// IEEE half bits to float, exactly as HalfToFloat on the host (subnormals exact, NaN payload
// kept).
__device__ __forceinline__ float HalfBitsToFloat(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
  if (exp == 0) {
    const float mag = __fmul_rn(static_cast<float>(mant), 5.9604644775390625e-8f);  // 2^-24
    return sign ? -mag : mag;
  }
  const uint32_t bits = exp == 0x1F ? (sign | 0x7F800000u | (mant << 13))
                                    : (sign | ((exp + (127 - 15)) << 23) | (mant << 13));
  return __uint_as_float(bits);
}

// The value at (source row, column) of a tensor of `type`. Quantized rows are whole blocks.
__device__ __forceinline__ float Value(uint32_t type, const uint8_t* src, int64_t row,
                                       int64_t cols, int64_t col) {
  switch (type) {
    case kGgufF32:
      return reinterpret_cast<const float*>(src)[row * cols + col];
    case kGgufF16:
      return HalfBitsToFloat(LoadU16(src + 2 * (row * cols + col)));
    case kGgufBf16:
      return __uint_as_float(LoadU16(src + 2 * (row * cols + col)) << 16);
    default:
      break;
  }
  const int64_t block = row * (cols / kQK) + col / kQK;
  const int j = static_cast<int>(col % kQK);
  if (type == kGgufQ8_0) {
    const uint8_t* b = src + block * 34;
    return __fmul_rn(HalfBitsToFloat(LoadU16(b)),
                     static_cast<float>(static_cast<int8_t>(b[2 + j])));
  }
  // Q4_0 and Q4_1: value j < 16 in the low nibble of byte j, value j + 16 in its high nibble.
  const bool q4_1 = type == kGgufQ4_1;
  const uint8_t* b = src + block * (q4_1 ? 20 : 18);
  const uint8_t byte = b[(q4_1 ? 4 : 2) + (j % 16)];
  const int q = j < 16 ? (byte & 0x0F) : (byte >> 4);
  const float d = HalfBitsToFloat(LoadU16(b));
  if (!q4_1) return __fmul_rn(d, static_cast<float>(q - 8));
  return __fadd_rn(__fmul_rn(d, static_cast<float>(q)), HalfBitsToFloat(LoadU16(b + 2)));
}

__global__ void DequantizeKernel(uint32_t type, const uint8_t* __restrict__ src, int64_t rows,
                                 int64_t cols, int rope_head_dim, __nv_bfloat16* __restrict__ dst) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / cols, col = i % cols;
    int64_t source_row = row;
    if (rope_head_dim > 0) {  // half-split row j * half + k comes from interleaved row 2k + j
      const int half = rope_head_dim / 2;
      const int64_t head = row / rope_head_dim;
      const int r = static_cast<int>(row % rope_head_dim);
      source_row = head * rope_head_dim + 2 * (r % half) + r / half;
    }
    dst[i] = __float2bfloat16_rn(Value(type, src, source_row, cols, col));
  }
}

}  // namespace

absl::Status DequantizeGgufToBf16(uint32_t type, const void* src, int64_t rows, int64_t cols,
                                  int rope_head_dim, __nv_bfloat16* dst, cudaStream_t stream) {
  const bool quantized = type == kGgufQ4_0 || type == kGgufQ4_1 || type == kGgufQ8_0;
  const bool plain = type == kGgufF32 || type == kGgufF16 || type == kGgufBf16;
  if (!quantized && !plain) {
    return absl::InvalidArgumentError(absl::StrCat("gguf dequantize: ggml type ", type,
                                                   " is not converted on the GPU"));
  }
  if (rows < 0 || cols <= 0 || (quantized && cols % kQK != 0) || rope_head_dim < 0 ||
      rope_head_dim % 2 != 0 || (rope_head_dim > 0 && rows % rope_head_dim != 0)) {
    return absl::InvalidArgumentError(absl::StrCat("gguf dequantize: ", rows, " x ", cols,
                                                   " values, rope head dim ", rope_head_dim));
  }
  if (rows == 0) return absl::OkStatus();
  if (src == nullptr || dst == nullptr) {
    return absl::InvalidArgumentError("gguf dequantize: a required pointer is null");
  }
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((rows * cols + kThreads - 1) / kThreads, 1 << 20);
  DequantizeKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      type, static_cast<const uint8_t*>(src), rows, cols, rope_head_dim, dst);
  RETURN_IF_CUDA_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace lazyattn
