#include "services/worker/model/ggml_type.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace lazyattn {
namespace {

// Every reader in this module reinterprets file bytes in place; GGUF and safetensors are both
// little-endian, so a big-endian host would silently produce garbage.
static_assert(std::endian::native == std::endian::little, "model readers assume little-endian");

// Debian's Abseil is built with its own absl::string_view (not an alias of std::string_view), so
// StrCat and Status messages need std::string_view pieces converted explicitly.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

constexpr int kMaxNamedId = 64;

// ggml type names by id, including ids we cannot decode (IQ*, TQ*), so that an error about a file
// with such tensors names the type the user will recognise rather than a bare number.
const std::array<std::string, kMaxNamedId>& TypeNames() {
  static const std::array<std::string, kMaxNamedId>* names = [] {
    auto* n = new std::array<std::string, kMaxNamedId>();
    for (int i = 0; i < kMaxNamedId; ++i) (*n)[i] = absl::StrCat("type<", i, ">");
    (*n)[0] = "F32";
    (*n)[1] = "F16";
    (*n)[2] = "Q4_0";
    (*n)[3] = "Q4_1";
    (*n)[6] = "Q5_0";
    (*n)[7] = "Q5_1";
    (*n)[8] = "Q8_0";
    (*n)[9] = "Q8_1";
    (*n)[10] = "Q2_K";
    (*n)[11] = "Q3_K";
    (*n)[12] = "Q4_K";
    (*n)[13] = "Q5_K";
    (*n)[14] = "Q6_K";
    (*n)[15] = "Q8_K";
    (*n)[16] = "IQ2_XXS";
    (*n)[17] = "IQ2_XS";
    (*n)[18] = "IQ3_XXS";
    (*n)[19] = "IQ1_S";
    (*n)[20] = "IQ4_NL";
    (*n)[21] = "IQ3_S";
    (*n)[22] = "IQ2_S";
    (*n)[23] = "IQ4_XS";
    (*n)[24] = "I8";
    (*n)[25] = "I16";
    (*n)[26] = "I32";
    (*n)[27] = "I64";
    (*n)[28] = "F64";
    (*n)[29] = "IQ1_M";
    (*n)[30] = "BF16";
    (*n)[34] = "TQ1_0";
    (*n)[35] = "TQ2_0";
    return n;
  }();
  return *names;
}

inline uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Block structs as ggml lays them out (ggml-common.h); offsets are spelled out rather than using
// packed structs so the reads are unaligned-safe (GGUF only aligns tensor starts, and Q8_0's
// 34-byte blocks put every other scale at an odd address).
constexpr int kQK = 32;

void DequantQ8_0(const uint8_t* src, int64_t blocks, float* dst) {
  for (int64_t b = 0; b < blocks; ++b, src += 34, dst += kQK) {
    const float d = HalfToFloat(LoadU16(src));
    const int8_t* qs = reinterpret_cast<const int8_t*>(src + 2);
    for (int j = 0; j < kQK; ++j) dst[j] = d * static_cast<float>(qs[j]);
  }
}

// Q4_0/Q4_1 pack element j (j < 16) in the low nibble of qs[j] and element j + 16 in the high
// nibble of the same byte, not adjacent elements in one byte.
void DequantQ4_0(const uint8_t* src, int64_t blocks, float* dst) {
  for (int64_t b = 0; b < blocks; ++b, src += 18, dst += kQK) {
    const float d = HalfToFloat(LoadU16(src));
    const uint8_t* qs = src + 2;
    for (int j = 0; j < kQK / 2; ++j) {
      dst[j] = d * static_cast<float>((qs[j] & 0x0F) - 8);
      dst[j + kQK / 2] = d * static_cast<float>((qs[j] >> 4) - 8);
    }
  }
}

void DequantQ4_1(const uint8_t* src, int64_t blocks, float* dst) {
  for (int64_t b = 0; b < blocks; ++b, src += 20, dst += kQK) {
    const float d = HalfToFloat(LoadU16(src));
    const float m = HalfToFloat(LoadU16(src + 2));
    const uint8_t* qs = src + 4;
    for (int j = 0; j < kQK / 2; ++j) {
      dst[j] = d * static_cast<float>(qs[j] & 0x0F) + m;
      dst[j + kQK / 2] = d * static_cast<float>(qs[j] >> 4) + m;
    }
  }
}

// The first of `n` IEEE values of type U (bit patterns, unaligned) with every exponent bit set
// (NaN or +-Inf), or -1. Runs are reduced without an early exit so the compiler vectorizes the
// common, all-finite case; only a run that holds a bad value is searched again.
template <typename U, U kExponent>
int64_t FirstNonFiniteBits(const uint8_t* src, int64_t n) {
  constexpr int64_t kRun = 1024;
  for (int64_t begin = 0; begin < n; begin += kRun) {
    const int64_t end = std::min(n, begin + kRun);
    U bad = 0;
    for (int64_t i = begin; i < end; ++i) {
      U v;
      std::memcpy(&v, src + i * sizeof(U), sizeof(U));
      bad |= static_cast<U>((v & kExponent) == kExponent);
    }
    if (bad == 0) continue;
    for (int64_t i = begin; i < end; ++i) {
      U v;
      std::memcpy(&v, src + i * sizeof(U), sizeof(U));
      if ((v & kExponent) == kExponent) return i;
    }
  }
  return -1;
}

// Byte offsets of a block type's fp16 scale fields (ggml-common.h): d, and m / dmin / s, or -1.
struct Fp16Scales {
  int d, second;
};
std::optional<Fp16Scales> BlockScales(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0:
    case GgmlType::kQ5_0:
    case GgmlType::kQ8_0:
      return Fp16Scales{0, -1};
    case GgmlType::kQ4_1:  // d, m
    case GgmlType::kQ5_1:  // d, m
    case GgmlType::kQ8_1:  // d, s (the block's sum, read by ggml's dot products)
    case GgmlType::kQ4_K:  // d, dmin
    case GgmlType::kQ5_K:  // d, dmin
      return Fp16Scales{0, 2};
    case GgmlType::kQ2_K:  // scales[16] qs[64] d dmin
      return Fp16Scales{80, 82};
    case GgmlType::kQ3_K:  // hmask[32] qs[64] scales[12] d
      return Fp16Scales{108, -1};
    case GgmlType::kQ6_K:  // ql[128] qh[64] scales[16] d
      return Fp16Scales{208, -1};
    default:
      return std::nullopt;
  }
}

}  // namespace

std::optional<NonFiniteElement> FindNonFinite(GgmlType type, const void* src,
                                              int64_t num_elements) {
  const auto* s = static_cast<const uint8_t*>(src);
  auto at = [&](int64_t i) -> std::optional<NonFiniteElement> {
    if (i < 0) return std::nullopt;
    float v = 0;
    (void)DequantizeToF32(type, s + i * (type == GgmlType::kF32 ? 4 : 2), 1, &v);
    return NonFiniteElement{i, v};
  };
  switch (type) {
    case GgmlType::kF32:
      return at(FirstNonFiniteBits<uint32_t, 0x7F800000u>(s, num_elements));
    case GgmlType::kF16:
      return at(FirstNonFiniteBits<uint16_t, 0x7C00u>(s, num_elements));
    case GgmlType::kBF16:
      return at(FirstNonFiniteBits<uint16_t, 0x7F80u>(s, num_elements));
    case GgmlType::kF64: {
      const int64_t i =
          FirstNonFiniteBits<uint64_t, uint64_t{0x7FF0000000000000u}>(s, num_elements);
      if (i < 0) return std::nullopt;
      double v;
      std::memcpy(&v, s + 8 * i, sizeof(v));
      return NonFiniteElement{i, static_cast<float>(v)};
    }
    case GgmlType::kQ8_K: {  // f32 d, qs[256], bsums[16]
      constexpr int64_t kQK_K = 256;
      for (int64_t b = 0; b < num_elements / kQK_K; ++b) {
        const uint8_t* block = s + b * 292;
        float d;
        std::memcpy(&d, block, sizeof(d));
        const auto* qs = reinterpret_cast<const int8_t*>(block + 4);
        for (int j = 0; j < kQK_K; ++j) {
          const float v = d * static_cast<float>(qs[j]);
          if (!std::isfinite(v)) return NonFiniteElement{b * kQK_K + j, v};
        }
      }
      return std::nullopt;
    }
    default:
      break;
  }
  const std::optional<Fp16Scales> scales = BlockScales(type);
  if (!scales.has_value()) return std::nullopt;  // integer types, or no known layout
  const GgmlBlockLayout layout = *GgmlLayout(type);
  const int64_t blocks = num_elements / layout.block_elements;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block = s + b * layout.block_bytes;
    const uint16_t d = LoadU16(block + scales->d);
    const uint16_t second = scales->second < 0 ? 0 : LoadU16(block + scales->second);
    if ((d & 0x7C00u) != 0x7C00u && (second & 0x7C00u) != 0x7C00u) continue;
    const int64_t first = b * layout.block_elements;
    if (GgmlIsDequantizable(type)) {
      std::vector<float> values(layout.block_elements);
      (void)DequantizeToF32(type, block, layout.block_elements, values.data());
      for (int64_t j = 0; j < layout.block_elements; ++j) {
        if (!std::isfinite(values[j])) return NonFiniteElement{first + j, values[j]};
      }
    }
    return NonFiniteElement{first, HalfToFloat((d & 0x7C00u) == 0x7C00u ? d : second)};
  }
  return std::nullopt;
}

int64_t FirstNonFiniteAsBf16(const void* src, int64_t num_elements) {
  // Magnitudes from the midpoint between bf16's largest finite value (0x7F7F) and infinity
  // upward, NaN and Inf included, as fp32 bits.
  constexpr uint32_t kFirstOverflowing = 0x7F7F8000u;
  const auto* s = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < num_elements; ++i) {
    uint32_t bits;
    std::memcpy(&bits, s + 4 * i, sizeof(bits));
    if ((bits & 0x7FFFFFFFu) >= kFirstOverflowing) return i;
  }
  return -1;
}

std::string_view GgmlTypeName(GgmlType type) {
  const uint32_t id = static_cast<uint32_t>(type);
  if (id < kMaxNamedId) return TypeNames()[id];
  // Ids past the table come only from corrupt or future files; the returned view must outlive
  // the call, so their names are interned (std::map nodes never move) under a lock.
  static std::mutex mu;
  static auto* interned = new std::map<uint32_t, std::string>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = interned->find(id);
  if (it == interned->end()) it = interned->emplace(id, absl::StrCat("type<", id, ">")).first;
  return it->second;
}

absl::StatusOr<GgmlBlockLayout> GgmlLayout(GgmlType type) {
  constexpr int64_t kQK_K = 256;
  switch (type) {
    case GgmlType::kF32:
      return GgmlBlockLayout{1, 4};
    case GgmlType::kF16:
      return GgmlBlockLayout{1, 2};
    case GgmlType::kBF16:
      return GgmlBlockLayout{1, 2};
    case GgmlType::kF64:
      return GgmlBlockLayout{1, 8};
    case GgmlType::kI8:
      return GgmlBlockLayout{1, 1};
    case GgmlType::kI16:
      return GgmlBlockLayout{1, 2};
    case GgmlType::kI32:
      return GgmlBlockLayout{1, 4};
    case GgmlType::kI64:
      return GgmlBlockLayout{1, 8};
    case GgmlType::kQ4_0:
      return GgmlBlockLayout{32, 18};  // d + 16 nibble bytes
    case GgmlType::kQ4_1:
      return GgmlBlockLayout{32, 20};  // d, m + 16
    case GgmlType::kQ5_0:
      return GgmlBlockLayout{32, 22};  // d + qh[4] + 16
    case GgmlType::kQ5_1:
      return GgmlBlockLayout{32, 24};  // d, m + qh[4] + 16
    case GgmlType::kQ8_0:
      return GgmlBlockLayout{32, 34};  // d + 32 int8
    case GgmlType::kQ8_1:
      return GgmlBlockLayout{32, 36};  // d, s + 32 int8
    case GgmlType::kQ2_K:
      return GgmlBlockLayout{kQK_K, 84};  // scales[16] qs[64] d dmin
    case GgmlType::kQ3_K:
      return GgmlBlockLayout{kQK_K, 110};  // hmask[32] qs[64] scales[12] d
    case GgmlType::kQ4_K:
      return GgmlBlockLayout{kQK_K, 144};  // d dmin scales[12] qs[128]
    case GgmlType::kQ5_K:
      return GgmlBlockLayout{kQK_K, 176};  // d dmin scales[12] qh[32] qs[128]
    case GgmlType::kQ6_K:
      return GgmlBlockLayout{kQK_K, 210};  // ql[128] qh[64] scales[16] d
    case GgmlType::kQ8_K:
      return GgmlBlockLayout{kQK_K, 292};  // f32 d, qs[256], bsums[16]
  }
  return absl::UnimplementedError(absl::StrCat("ggml type ", Sv(GgmlTypeName(type)), " (id ",
                                               static_cast<uint32_t>(type), ") is not supported"));
}

absl::StatusOr<size_t> GgmlRowBytes(GgmlType type, int64_t num_elements) {
  absl::StatusOr<GgmlBlockLayout> layout = GgmlLayout(type);
  if (!layout.ok()) return layout.status();
  if (num_elements < 0) {
    return absl::InvalidArgumentError(absl::StrCat("negative element count ", num_elements,
                                                   " for ggml type ", Sv(GgmlTypeName(type))));
  }
  if (num_elements % layout->block_elements != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(num_elements, " elements is not a whole number of ", Sv(GgmlTypeName(type)),
                     " blocks of ", layout->block_elements));
  }
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(num_elements / layout->block_elements),
                             static_cast<uint64_t>(layout->block_bytes), &bytes) ||
      bytes > SIZE_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        num_elements, " elements of ", Sv(GgmlTypeName(type)), " overflow the addressable size"));
  }
  return static_cast<size_t>(bytes);
}

bool GgmlIsDequantizable(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
      return true;
    default:
      return false;
  }
}

absl::Status DequantizeToF32(GgmlType type, const void* src, int64_t num_elements, float* dst) {
  if (!GgmlIsDequantizable(type)) {
    return absl::UnimplementedError(absl::StrCat("dequantizing ggml type ", Sv(GgmlTypeName(type)),
                                                 " (id ", static_cast<uint32_t>(type),
                                                 ") is not supported"));
  }
  // Validates the element count against the block size, so the loops below never read a
  // partial block.
  absl::StatusOr<size_t> bytes = GgmlRowBytes(type, num_elements);
  if (!bytes.ok()) return bytes.status();
  const auto* s = static_cast<const uint8_t*>(src);
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, s, *bytes);
      break;
    case GgmlType::kF16:
      for (int64_t i = 0; i < num_elements; ++i) dst[i] = HalfToFloat(LoadU16(s + 2 * i));
      break;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < num_elements; ++i) dst[i] = Bf16ToFloat(LoadU16(s + 2 * i));
      break;
    case GgmlType::kQ8_0:
      DequantQ8_0(s, num_elements / kQK, dst);
      break;
    case GgmlType::kQ4_0:
      DequantQ4_0(s, num_elements / kQK, dst);
      break;
    case GgmlType::kQ4_1:
      DequantQ4_1(s, num_elements / kQK, dst);
      break;
    default:
      break;  // Unreachable: filtered by GgmlIsDequantizable above.
  }
  return absl::OkStatus();
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  if (exp == 0) {
    // Zero or subnormal: value = mant * 2^-24, exact in fp32.
    const float mag = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -mag : mag;
  }
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);  // inf, or NaN keeping its payload
  } else {
    bits = sign | ((exp + (127 - 15)) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

float Bf16ToFloat(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

}  // namespace lazyattn
