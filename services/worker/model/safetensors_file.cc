#include "services/worker/model/safetensors_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "services/worker/model/ggml_type.h"
#include "services/worker/model/mapped_file.h"
#include "services/worker/model/tensor_extents.h"

namespace lazyattn {
namespace {

// Debian's Abseil is built with its own absl::string_view (not an alias of std::string_view), so
// StrCat and Status messages need std::string_view pieces converted explicitly.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

constexpr size_t kLengthPrefixBytes = 8;

struct DtypeInfo {
  std::string_view name;
  SafetensorsDtype dtype;
  int bytes;
  bool supported;
};

// The dtype strings of the safetensors spec. Sizes let Open() check extents even for dtypes we
// cannot convert, so a corrupt file is reported as corrupt rather than as unsupported.
constexpr DtypeInfo kDtypes[] = {
    {"F32", SafetensorsDtype::kF32, 4, true},
    {"F16", SafetensorsDtype::kF16, 2, true},
    {"BF16", SafetensorsDtype::kBF16, 2, true},
    {"F64", SafetensorsDtype::kF64, 8, false},
    {"I8", SafetensorsDtype::kI8, 1, false},
    {"I16", SafetensorsDtype::kI16, 2, false},
    {"I32", SafetensorsDtype::kI32, 4, false},
    {"I64", SafetensorsDtype::kI64, 8, false},
    {"U8", SafetensorsDtype::kU8, 1, false},
    {"U16", SafetensorsDtype::kU16, 2, false},
    {"U32", SafetensorsDtype::kU32, 4, false},
    {"U64", SafetensorsDtype::kU64, 8, false},
    {"BOOL", SafetensorsDtype::kBool, 1, false},
    {"F8_E4M3", SafetensorsDtype::kF8E4M3, 1, false},
    {"F8_E5M2", SafetensorsDtype::kF8E5M2, 1, false},
};

const DtypeInfo* FindDtype(std::string_view name) {
  for (const DtypeInfo& d : kDtypes) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

// Reads a JSON value as a non-negative int64; nlohmann parses non-negative integer literals as
// unsigned and negative ones as signed, and floats as floats, so only the unsigned case is valid.
bool AsCount(const nlohmann::json& j, int64_t* out) {
  if (!j.is_number_unsigned()) return false;
  const uint64_t v = j.get<uint64_t>();
  if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
  *out = static_cast<int64_t>(v);
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  ASSIGN_OR_RETURN(file->mapping_, MappedFile::Open(path, kLengthPrefixBytes, "the 8-byte header length"));
  file->map_ = file->mapping_.data();
  file->map_size_ = file->mapping_.size();
  RETURN_IF_ERROR(file->ParseHeader());  // ~SafetensorsFile releases the mapping on failure.
  return file;
}

SafetensorsFile::~SafetensorsFile() = default;

absl::Status SafetensorsFile::ParseHeader() {
  uint64_t header_len;
  std::memcpy(&header_len, map_, sizeof(header_len));  // little-endian host (see ggml_type.cc)
  if (header_len > map_size_ - kLengthPrefixBytes) {
    return absl::DataLossError(absl::StrCat(path_, ": truncated: header length ", header_len,
                                            " exceeds the ", map_size_ - kLengthPrefixBytes,
                                            " bytes after the length prefix"));
  }
  if (header_len > kMaxSafetensorsHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": header length ", header_len,
                                                   " exceeds the format's limit of ",
                                                   kMaxSafetensorsHeaderBytes, " bytes"));
  }
  const char* json_begin = reinterpret_cast<const char*>(map_ + kLengthPrefixBytes);
  const uint8_t* data = map_ + kLengthPrefixBytes + header_len;
  const uint64_t data_size = map_size_ - kLengthPrefixBytes - header_len;

  // nlohmann reports type errors (e.g. a string where a number belongs) by throwing; the API
  // promises a Status, so every access below stays inside this try.
  std::string current;
  try {
    const nlohmann::json header =
        nlohmann::json::parse(json_begin, json_begin + header_len, nullptr,
                              /*allow_exceptions=*/false);
    if (header.is_discarded()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path_, ": header is not valid JSON (", header_len, " bytes)"));
    }
    if (!header.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(path_, ": header is not a JSON object"));
    }
    // nlohmann's default object is a std::map, so iteration (and tensors_) is sorted by name.
    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") continue;
      current = name;
      // Named capture: clang 14 (the fuzz build's compiler) cannot capture a structured binding.
      auto bad = [&, &tensor = name](absl::string_view why) {
        return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor '", tensor, "': ", why));
      };
      if (!entry.is_object()) return bad("entry is not an object");
      Tensor t;
      t.name = name;

      auto dtype_it = entry.find("dtype");
      if (dtype_it == entry.end() || !dtype_it->is_string()) return bad("missing string 'dtype'");
      t.dtype_name = dtype_it->get<std::string>();
      const DtypeInfo* info = FindDtype(t.dtype_name);
      if (info != nullptr) {
        t.dtype = info->dtype;
        t.supported = info->supported;
      }

      auto shape_it = entry.find("shape");
      if (shape_it == entry.end() || !shape_it->is_array()) return bad("missing array 'shape'");
      int64_t n = 1;
      for (const nlohmann::json& d : *shape_it) {
        int64_t dim;
        if (!AsCount(d, &dim)) {
          return bad(d.is_primitive()
                         ? absl::StrCat("bad shape entry ",
                                        d.dump(-1, ' ', false,
                                               nlohmann::json::error_handler_t::replace))
                         : std::string("bad shape entry (not an integer)"));
        }
        if (__builtin_mul_overflow(n, dim, &n)) return bad("shape overflows the element count");
        t.shape.push_back(dim);
      }
      t.num_elements = n;

      auto off_it = entry.find("data_offsets");
      int64_t begin, end;
      if (off_it == entry.end() || !off_it->is_array() || off_it->size() != 2 ||
          !AsCount((*off_it)[0], &begin) || !AsCount((*off_it)[1], &end)) {
        return bad("'data_offsets' must be [begin, end] of non-negative integers");
      }
      if (begin > end) return bad(absl::StrCat("data_offsets [", begin, ", ", end, "] reversed"));
      if (static_cast<uint64_t>(end) > data_size) {
        return absl::DataLossError(
            absl::StrCat(path_, ": tensor '", name, "': data_offsets [", begin, ", ", end,
                         "] run past the end of the data section (", data_size, " bytes)"));
      }
      t.num_bytes = static_cast<size_t>(end - begin);
      if (info != nullptr) {
        uint64_t want;
        if (__builtin_mul_overflow(static_cast<uint64_t>(n), static_cast<uint64_t>(info->bytes),
                                   &want) ||
            want != t.num_bytes) {
          return bad(absl::StrCat("data_offsets span ", t.num_bytes, " bytes but shape needs ", n,
                                  " x ", info->bytes, " bytes of ", t.dtype_name));
        }
      }
      t.data = data + begin;
      tensor_index_.emplace(t.name, tensors_.size());
      tensors_.push_back(std::move(t));
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": malformed header",
                                                   current.empty() ? "" : " at tensor '", current,
                                                   current.empty() ? "" : "'", ": ", e.what()));
  }
  // After the loop: the names' views must not move with tensors_.
  std::vector<TensorExtent> extents;
  extents.reserve(tensors_.size());
  for (const Tensor& t : tensors_) {
    extents.push_back({t.name, static_cast<uint64_t>(t.data - data), t.num_bytes});
  }
  return CheckTensorsDisjoint(path_, std::move(extents));
}

absl::StatusOr<const SafetensorsFile::Tensor*> SafetensorsFile::FindTensor(
    std::string_view name) const {
  auto it = tensor_index_.find(name);
  if (it == tensor_index_.end()) {
    return absl::NotFoundError(absl::StrCat(path_, ": tensor '", Sv(name), "' not found"));
  }
  return &tensors_[it->second];
}

absl::Status SafetensorsFile::ReadAsF32(const Tensor& t, float* dst) const {
  // A Tensor from another (possibly closed) file would read freed memory; refuse it.
  const auto p = reinterpret_cast<uintptr_t>(t.data);
  const auto lo = reinterpret_cast<uintptr_t>(map_);
  if (p < lo || p - lo > map_size_ || t.num_bytes > map_size_ - (p - lo)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": tensor '", t.name, "' does not belong to this file"));
  }
  if (!t.supported) {
    return absl::UnimplementedError(absl::StrCat(path_, ": tensor '", t.name, "' has dtype ",
                                                 t.dtype_name,
                                                 "; only F32, F16 and BF16 are supported"));
  }
  switch (t.dtype) {
    case SafetensorsDtype::kF32:
      std::memcpy(dst, t.data, t.num_bytes);
      break;
    case SafetensorsDtype::kF16:
    case SafetensorsDtype::kBF16: {
      const bool half = t.dtype == SafetensorsDtype::kF16;
      for (int64_t i = 0; i < t.num_elements; ++i) {
        uint16_t v;
        std::memcpy(&v, t.data + 2 * i, sizeof(v));
        dst[i] = half ? HalfToFloat(v) : Bf16ToFloat(v);
      }
      break;
    }
    default:
      return absl::InternalError(absl::StrCat(path_, ": tensor '", t.name, "': dtype ",
                                              t.dtype_name, " marked supported but not handled"));
  }
  return absl::OkStatus();
}

}  // namespace lazyattn
