#include "services/worker/model/gguf_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "services/worker/model/mapped_file.h"
#include "services/worker/model/tensor_extents.h"

namespace lazyattn {
namespace {

// On-disk metadata value type ids (gguf.h `enum gguf_type`).
enum GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// Debian's Abseil is built with its own absl::string_view (not an alias of std::string_view), so
// StrCat and Status messages need std::string_view pieces converted explicitly.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

constexpr uint64_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;                     // GGML_MAX_DIMS
constexpr size_t kFixedHeaderBytes = 4 + 4 + 8 + 8;  // magic, version, tensor and kv counts
// Smallest possible encodings, used to reject counts that cannot fit in the rest of the file
// before anything is allocated for them.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;                  // empty key, type, 1-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // empty name, n_dims, 1 dim, type, off

absl::string_view ValueTypeName(uint32_t t) {
  switch (t) {
    case kUint8:
      return "uint8";
    case kInt8:
      return "int8";
    case kUint16:
      return "uint16";
    case kInt16:
      return "int16";
    case kUint32:
      return "uint32";
    case kInt32:
      return "int32";
    case kFloat32:
      return "float32";
    case kBool:
      return "bool";
    case kString:
      return "string";
    case kArray:
      return "array";
    case kUint64:
      return "uint64";
    case kInt64:
      return "int64";
    case kFloat64:
      return "float64";
  }
  return "unknown";
}

// Smallest encoded size of one array element of type `t`; 0 for types not allowed in arrays.
uint64_t MinElementBytes(uint32_t t) {
  switch (t) {
    case kUint8:
    case kInt8:
    case kBool:
      return 1;
    case kUint16:
    case kInt16:
      return 2;
    case kUint32:
    case kInt32:
    case kFloat32:
      return 4;
    case kUint64:
    case kInt64:
    case kFloat64:
      return 8;
    case kString:
      return 8;  // the length prefix alone
  }
  return 0;
}

absl::string_view HeldTypeName(const GgufValue& v) {
  switch (v.value.index()) {
    case 0:
      return "integer";
    case 1:
      return "float";
    case 2:
      return "bool";
    case 3:
      return "string";
  }
  switch (std::get<GgufValue::Array>(v.value).index()) {
    case 0:
      return "integer array";
    case 1:
      return "float array";
    case 2:
      return "string array";
  }
  return "bool array";
}

}  // namespace

// Walks the mapped bytes once, filling a GgufFile. Every read goes through Need(), so the parser
// never touches a byte past the end of the mapping.
class GgufParser {
 public:
  explicit GgufParser(GgufFile* file) : f_(*file) {}

  absl::Status Parse() {
    ASSIGN_OR_RETURN(uint32_t magic, Read<uint32_t>("magic"));
    if (std::memcmp(&magic, "GGUF", 4) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(f_.path_, ": not a GGUF file (bad magic)"));
    }
    ASSIGN_OR_RETURN(f_.version_, Read<uint32_t>("version"));
    if (f_.version_ != 2 && f_.version_ != 3) {
      // A byte-swapped small number means a big-endian GGUF, which ggml can write but we do not
      // read; say so rather than just "bad version".
      const bool swapped = f_.version_ == 0x02000000u || f_.version_ == 0x03000000u;
      return absl::InvalidArgumentError(absl::StrCat(
          f_.path_, ": unsupported GGUF version ", f_.version_,
          swapped ? " (big-endian file, only little-endian is supported)" : " (want 2 or 3)"));
    }
    ASSIGN_OR_RETURN(uint64_t n_tensors, Read<uint64_t>("tensor count"));
    ASSIGN_OR_RETURN(uint64_t n_kv, Read<uint64_t>("metadata count"));
    if (n_kv > Remaining() / kMinKvBytes) {
      return absl::InvalidArgumentError(absl::StrCat(f_.path_, ": metadata count ", n_kv,
                                                     " cannot fit in a file of ", f_.map_size_,
                                                     " bytes (corrupt or truncated)"));
    }
    if (n_tensors > (Remaining() - n_kv * kMinKvBytes) / kMinTensorInfoBytes) {
      return absl::InvalidArgumentError(absl::StrCat(f_.path_, ": tensor count ", n_tensors,
                                                     " cannot fit in a file of ", f_.map_size_,
                                                     " bytes (corrupt or truncated)"));
    }

    for (uint64_t i = 0; i < n_kv; ++i) RETURN_IF_ERROR(ParseKv(i));
    ASSIGN_OR_RETURN(uint64_t alignment, Alignment());

    std::vector<uint64_t> offsets;
    f_.tensors_.reserve(n_tensors);
    offsets.reserve(n_tensors);
    for (uint64_t i = 0; i < n_tensors; ++i) {
      ASSIGN_OR_RETURN(uint64_t offset, ParseTensorInfo(i));
      offsets.push_back(offset);
    }
    if (n_tensors == 0) return absl::OkStatus();

    // The data section starts at the next multiple of the alignment after the directory.
    const uint64_t data_start = (pos_ + alignment - 1) / alignment * alignment;
    if (data_start > f_.map_size_) {
      return absl::DataLossError(absl::StrCat(f_.path_, ": truncated: tensor data would start at ",
                                              data_start, " but the file has ", f_.map_size_,
                                              " bytes"));
    }
    const uint64_t data_size = f_.map_size_ - data_start;
    std::vector<TensorExtent> extents;
    extents.reserve(f_.tensors_.size());
    for (size_t i = 0; i < f_.tensors_.size(); ++i) {
      GgufTensorInfo& t = f_.tensors_[i];
      const uint64_t off = offsets[i];
      if (off % alignment != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(f_.path_, ": tensor '", t.name, "' data offset ", off,
                         " is not a multiple of the alignment ", alignment));
      }
      if (off > data_size || t.num_bytes > data_size - off) {
        return absl::DataLossError(
            absl::StrCat(f_.path_, ": tensor '", t.name, "' data [", off, ", +", t.num_bytes,
                         ") runs past the end of the data section (", data_size, " bytes)"));
      }
      t.data = f_.map_ + data_start + off;
      extents.push_back({t.name, off, t.num_bytes});
    }
    return CheckTensorsDisjoint(f_.path_, std::move(extents));
  }

 private:
  uint64_t Remaining() const { return f_.map_size_ - pos_; }

  // `what` is a literal naming the field; `ctx_` names the key or tensor being parsed.
  absl::Status Need(uint64_t n, absl::string_view what) const {
    if (n <= Remaining()) return absl::OkStatus();
    return absl::DataLossError(absl::StrCat(f_.path_, ": truncated reading ", what,
                                            ctx_.empty() ? "" : " of ", ctx_, " at offset ", pos_,
                                            ": need ", n, " bytes, ", Remaining(), " left"));
  }

  template <typename T>
  absl::StatusOr<T> Read(absl::string_view what) {
    RETURN_IF_ERROR(Need(sizeof(T), what));
    T v;
    std::memcpy(&v, f_.map_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  absl::StatusOr<std::string> ReadString(absl::string_view what) {
    ASSIGN_OR_RETURN(uint64_t len, Read<uint64_t>(what));
    RETURN_IF_ERROR(Need(len, what));
    std::string s(reinterpret_cast<const char*>(f_.map_ + pos_), len);
    pos_ += len;
    return s;
  }

  absl::Status Invalid(absl::string_view msg) const {
    return absl::InvalidArgumentError(absl::StrCat(f_.path_, ": ", ctx_, ": ", msg));
  }

  // Reads one scalar of integer type `t` widened to int64; uint64 values above INT64_MAX are
  // rejected rather than wrapped.
  absl::StatusOr<int64_t> ReadInt(uint32_t t) {
    switch (t) {
      case kUint8: {
        ASSIGN_OR_RETURN(uint8_t v, Read<uint8_t>("uint8"));
        return v;
      }
      case kInt8: {
        ASSIGN_OR_RETURN(int8_t v, Read<int8_t>("int8"));
        return v;
      }
      case kUint16: {
        ASSIGN_OR_RETURN(uint16_t v, Read<uint16_t>("uint16"));
        return v;
      }
      case kInt16: {
        ASSIGN_OR_RETURN(int16_t v, Read<int16_t>("int16"));
        return v;
      }
      case kUint32: {
        ASSIGN_OR_RETURN(uint32_t v, Read<uint32_t>("uint32"));
        return v;
      }
      case kInt32: {
        ASSIGN_OR_RETURN(int32_t v, Read<int32_t>("int32"));
        return v;
      }
      case kInt64: {
        ASSIGN_OR_RETURN(int64_t v, Read<int64_t>("int64"));
        return v;
      }
      case kUint64: {
        ASSIGN_OR_RETURN(uint64_t v, Read<uint64_t>("uint64"));
        if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          return Invalid(absl::StrCat("uint64 value ", v, " does not fit in int64"));
        }
        return static_cast<int64_t>(v);
      }
    }
    return Invalid("internal: not an integer type");
  }

  absl::StatusOr<double> ReadFloat(uint32_t t) {
    if (t == kFloat32) {
      ASSIGN_OR_RETURN(float v, Read<float>("float32"));
      return v;
    }
    ASSIGN_OR_RETURN(double v, Read<double>("float64"));
    return v;
  }

  absl::StatusOr<bool> ReadBool() {
    ASSIGN_OR_RETURN(uint8_t v, Read<uint8_t>("bool"));
    if (v > 1) return Invalid(absl::StrCat("bool value ", static_cast<int>(v), " is not 0 or 1"));
    return v == 1;
  }

  static bool IsInt(uint32_t t) { return t <= kInt32 || t == kUint64 || t == kInt64; }

  absl::StatusOr<GgufValue::Array> ReadArray() {
    ASSIGN_OR_RETURN(uint32_t et, Read<uint32_t>("array element type"));
    ASSIGN_OR_RETURN(uint64_t n, Read<uint64_t>("array length"));
    if (et == kArray) return Invalid("nested arrays are not supported");
    const uint64_t min_bytes = MinElementBytes(et);
    if (min_bytes == 0) return Invalid(absl::StrCat("unknown array element type id ", et));
    if (n > Remaining() / min_bytes) {
      return absl::DataLossError(absl::StrCat(f_.path_, ": ", ctx_, ": array of ", n, " ",
                                              ValueTypeName(et), " cannot fit in the ", Remaining(),
                                              " bytes left"));
    }
    if (IsInt(et)) {
      std::vector<int64_t> v;
      v.reserve(n);
      for (uint64_t i = 0; i < n; ++i) {
        ASSIGN_OR_RETURN(int64_t x, ReadInt(et));
        v.push_back(x);
      }
      return GgufValue::Array(std::move(v));
    }
    if (et == kFloat32 || et == kFloat64) {
      std::vector<double> v;
      v.reserve(n);
      for (uint64_t i = 0; i < n; ++i) {
        ASSIGN_OR_RETURN(double x, ReadFloat(et));
        v.push_back(x);
      }
      return GgufValue::Array(std::move(v));
    }
    if (et == kBool) {
      std::vector<bool> v;
      v.reserve(n);
      for (uint64_t i = 0; i < n; ++i) {
        ASSIGN_OR_RETURN(bool x, ReadBool());
        v.push_back(x);
      }
      return GgufValue::Array(std::move(v));
    }
    std::vector<std::string> v;
    v.reserve(n);
    for (uint64_t i = 0; i < n; ++i) {
      ASSIGN_OR_RETURN(std::string x, ReadString("array string"));
      v.push_back(std::move(x));
    }
    return GgufValue::Array(std::move(v));
  }

  absl::Status ParseKv(uint64_t index) {
    ctx_ = absl::StrCat("metadata entry #", index);
    ASSIGN_OR_RETURN(std::string key, ReadString("key"));
    ctx_ = absl::StrCat("metadata key '", key, "'");
    ASSIGN_OR_RETURN(uint32_t type, Read<uint32_t>("value type"));
    GgufValue value;
    if (IsInt(type)) {
      ASSIGN_OR_RETURN(int64_t v, ReadInt(type));
      value.value = v;
    } else if (type == kFloat32 || type == kFloat64) {
      ASSIGN_OR_RETURN(double v, ReadFloat(type));
      value.value = v;
    } else if (type == kBool) {
      ASSIGN_OR_RETURN(bool v, ReadBool());
      value.value = v;
    } else if (type == kString) {
      ASSIGN_OR_RETURN(std::string v, ReadString("string value"));
      value.value = std::move(v);
    } else if (type == kArray) {
      ASSIGN_OR_RETURN(GgufValue::Array v, ReadArray());
      value.value = std::move(v);
    } else {
      return Invalid(absl::StrCat("unknown value type id ", type));
    }
    if (!f_.metadata_.emplace(std::move(key), std::move(value)).second) {
      return Invalid("duplicate key");
    }
    ctx_.clear();
    return absl::OkStatus();
  }

  absl::StatusOr<uint64_t> Alignment() {
    auto it = f_.metadata_.find("general.alignment");
    if (it == f_.metadata_.end()) return kDefaultAlignment;
    const int64_t* a = std::get_if<int64_t>(&it->second.value);
    ctx_ = "metadata key 'general.alignment'";
    if (a == nullptr) return Invalid("must be an integer");
    if (*a <= 0 || *a > std::numeric_limits<uint32_t>::max() || (*a & (*a - 1)) != 0) {
      return Invalid(absl::StrCat("alignment ", *a, " is not a power of two"));
    }
    ctx_.clear();
    return static_cast<uint64_t>(*a);
  }

  // Parses one directory entry; returns its data offset (relative to the data section), which
  // can only be checked once the directory's end, and so the data section's start, is known.
  absl::StatusOr<uint64_t> ParseTensorInfo(uint64_t index) {
    ctx_ = absl::StrCat("tensor #", index);
    GgufTensorInfo t;
    ASSIGN_OR_RETURN(t.name, ReadString("name"));
    ctx_ = absl::StrCat("tensor '", t.name, "'");
    ASSIGN_OR_RETURN(uint32_t n_dims, Read<uint32_t>("n_dims"));
    if (n_dims < 1 || n_dims > kMaxDims) {
      return Invalid(absl::StrCat("n_dims ", n_dims, " is not in 1..", kMaxDims));
    }
    int64_t n = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      ASSIGN_OR_RETURN(uint64_t dim, Read<uint64_t>("dimension"));
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          __builtin_mul_overflow(n, static_cast<int64_t>(dim), &n)) {
        return Invalid(absl::StrCat("dimension ", d, " (", dim, ") overflows the element count"));
      }
      t.dims.push_back(static_cast<int64_t>(dim));
    }
    t.num_elements = n;
    ASSIGN_OR_RETURN(uint32_t type_id, Read<uint32_t>("type"));
    t.type = static_cast<GgmlType>(type_id);
    absl::StatusOr<GgmlBlockLayout> layout = GgmlLayout(t.type);
    if (!layout.ok()) {
      return absl::UnimplementedError(absl::StrCat(f_.path_, ": ", ctx_, ": unsupported ggml type ",
                                                   Sv(GgmlTypeName(t.type)), " (id ", type_id,
                                                   ")"));
    }
    // ggml quantizes along rows, so each row (dims[0]) must be a whole number of blocks, not
    // just the tensor as a whole.
    if (t.dims[0] % layout->block_elements != 0) {
      return Invalid(absl::StrCat("row length ", t.dims[0], " is not a multiple of the ",
                                  Sv(GgmlTypeName(t.type)), " block size ",
                                  layout->block_elements));
    }
    absl::StatusOr<size_t> bytes = GgmlRowBytes(t.type, n);
    if (!bytes.ok()) return Invalid(bytes.status().message());
    t.num_bytes = *bytes;
    ASSIGN_OR_RETURN(uint64_t offset, Read<uint64_t>("data offset"));
    if (f_.tensor_index_.count(t.name) != 0) return Invalid("duplicate tensor name");
    f_.tensor_index_.emplace(t.name, f_.tensors_.size());
    f_.tensors_.push_back(std::move(t));
    ctx_.clear();
    return offset;
  }

  GgufFile& f_;
  size_t pos_ = 0;
  std::string ctx_;
};

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = path;
  ASSIGN_OR_RETURN(file->mapping_, MappedFile::Open(path, kFixedHeaderBytes, "the GGUF header"));
  file->map_ = file->mapping_.data();
  file->map_size_ = file->mapping_.size();
  GgufParser parser(file.get());
  RETURN_IF_ERROR(parser.Parse());  // ~GgufFile releases the mapping on failure.
  return file;
}

GgufFile::~GgufFile() = default;

bool GgufFile::Has(std::string_view key) const { return metadata_.find(key) != metadata_.end(); }

namespace {

// Looks up `key` and returns the alternative T of its value, or NotFound / InvalidArgument naming
// the file, the key, and both types.
template <typename T>
absl::StatusOr<const T*> Lookup(const std::string& path,
                                const std::map<std::string, GgufValue, std::less<>>& md,
                                std::string_view key, absl::string_view want) {
  auto it = md.find(key);
  if (it == md.end()) {
    return absl::NotFoundError(absl::StrCat(path, ": metadata key '", Sv(key), "' not found"));
  }
  const T* v = nullptr;
  if constexpr (std::is_same_v<T, std::vector<int64_t>> || std::is_same_v<T, std::vector<double>> ||
                std::is_same_v<T, std::vector<std::string>>) {
    if (const auto* arr = std::get_if<GgufValue::Array>(&it->second.value)) {
      v = std::get_if<T>(arr);
    }
  } else {
    v = std::get_if<T>(&it->second.value);
  }
  if (v == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": metadata key '", Sv(key), "' is a ",
                                                   HeldTypeName(it->second), ", want ", want));
  }
  return v;
}

}  // namespace

absl::StatusOr<std::string> GgufFile::GetString(std::string_view key) const {
  ASSIGN_OR_RETURN(const std::string* v, Lookup<std::string>(path_, metadata_, key, "string"));
  return *v;
}

absl::StatusOr<int64_t> GgufFile::GetInt(std::string_view key) const {
  ASSIGN_OR_RETURN(const int64_t* v, Lookup<int64_t>(path_, metadata_, key, "integer"));
  return *v;
}

absl::StatusOr<double> GgufFile::GetFloat(std::string_view key) const {
  auto it = metadata_.find(key);
  if (it != metadata_.end()) {
    if (const int64_t* i = std::get_if<int64_t>(&it->second.value)) return static_cast<double>(*i);
  }
  ASSIGN_OR_RETURN(const double* v, Lookup<double>(path_, metadata_, key, "float"));
  return *v;
}

absl::StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  ASSIGN_OR_RETURN(const bool* v, Lookup<bool>(path_, metadata_, key, "bool"));
  return *v;
}

absl::StatusOr<std::vector<std::string>> GgufFile::GetStringArray(std::string_view key) const {
  ASSIGN_OR_RETURN(const std::vector<std::string>* v,
                   Lookup<std::vector<std::string>>(path_, metadata_, key, "string array"));
  return *v;
}

absl::StatusOr<std::vector<int64_t>> GgufFile::GetIntArray(std::string_view key) const {
  ASSIGN_OR_RETURN(const std::vector<int64_t>* v,
                   Lookup<std::vector<int64_t>>(path_, metadata_, key, "integer array"));
  return *v;
}

absl::StatusOr<std::vector<double>> GgufFile::GetFloatArray(std::string_view key) const {
  // Integer arrays convert, mirroring GetFloat, since writers are inconsistent about which they
  // emit for things like per-layer sizes.
  auto it = metadata_.find(key);
  if (it != metadata_.end()) {
    if (const auto* arr = std::get_if<GgufValue::Array>(&it->second.value)) {
      if (const auto* ints = std::get_if<std::vector<int64_t>>(arr)) {
        return std::vector<double>(ints->begin(), ints->end());
      }
    }
  }
  ASSIGN_OR_RETURN(const std::vector<double>* v,
                   Lookup<std::vector<double>>(path_, metadata_, key, "float array"));
  return *v;
}

absl::StatusOr<const GgufTensorInfo*> GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  if (it == tensor_index_.end()) {
    return absl::NotFoundError(absl::StrCat(path_, ": tensor '", Sv(name), "' not found"));
  }
  return &tensors_[it->second];
}

}  // namespace lazyattn
