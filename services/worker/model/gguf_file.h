// Read-only view of a GGUF file (llama.cpp's model format), memory-mapped.
//
// Contract:
// - Open() validates the whole header, metadata and tensor directory up front: magic, version (2 or
//   3), every length against the file size, tensor types, tensor extents and alignment. A file that
//   passes Open() can be read with no further bounds checks; a bad one yields an absl::Status
//   (InvalidArgument / DataLoss / NotFound, or Unimplemented for a tensor type id whose block
//   layout is unknown) whose message names the file and the offending key or tensor. Nothing here
//   aborts.
// - The GgufFile owns the mapping; TensorInfo::data and string_views point into it and live as
//   long as the GgufFile.
// - Dimensions are in GGUF (ggml) order: dims[0] is the contiguous (fastest) dimension. A 2-D
//   weight of an `out x in` matrix has dims = {in, out}.
#ifndef LAZYATTN_SERVICES_WORKER_MODEL_GGUF_FILE_H_
#define LAZYATTN_SERVICES_WORKER_MODEL_GGUF_FILE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "services/worker/model/mapped_file.h"
#include "services/worker/model/ggml_type.h"

namespace lazyattn {

// One metadata value. Arrays are kept typed; nested arrays are rejected at Open() (no model we
// support uses them).
struct GgufValue {
  using Array = std::variant<std::vector<int64_t>, std::vector<double>, std::vector<std::string>,
                             std::vector<bool>>;
  std::variant<int64_t, double, bool, std::string, Array> value;
};

struct GgufTensorInfo {
  std::string name;
  GgmlType type;
  std::vector<int64_t> dims;  // ggml order, dims[0] contiguous
  int64_t num_elements = 0;
  const uint8_t* data = nullptr;  // into the mapping
  size_t num_bytes = 0;
};

class GgufFile {
 public:
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }

  bool Has(std::string_view key) const;
  // Typed getters: NotFound if the key is absent, InvalidArgument if it has another type. Integer
  // getters accept any GGUF integer type whose value fits.
  absl::StatusOr<std::string> GetString(std::string_view key) const;
  absl::StatusOr<int64_t> GetInt(std::string_view key) const;
  absl::StatusOr<double> GetFloat(std::string_view key) const;  // also accepts integers
  absl::StatusOr<bool> GetBool(std::string_view key) const;
  absl::StatusOr<std::vector<std::string>> GetStringArray(std::string_view key) const;
  absl::StatusOr<std::vector<int64_t>> GetIntArray(std::string_view key) const;
  absl::StatusOr<std::vector<double>> GetFloatArray(std::string_view key) const;

  const std::map<std::string, GgufValue, std::less<>>& metadata() const { return metadata_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  // NotFound naming the tensor and the file when absent.
  absl::StatusOr<const GgufTensorInfo*> FindTensor(std::string_view name) const;

 private:
  GgufFile() = default;
  std::string path_;
  uint32_t version_ = 0;
  MappedFile mapping_;
  const uint8_t* map_ = nullptr;  // mapping_.data(), kept short for the parser
  size_t map_size_ = 0;           // mapping_.size()
  std::map<std::string, GgufValue, std::less<>> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
  friend class GgufParser;
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_MODEL_GGUF_FILE_H_
