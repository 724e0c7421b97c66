// Read-only view of a safetensors file (Hugging Face's tensor container), memory-mapped.
//
// Layout: an 8-byte little-endian header length N, N bytes of JSON mapping tensor names to
// {"dtype", "shape", "data_offsets": [begin, end]} (plus an optional "__metadata__" object, which
// is ignored), then the data section that the offsets are relative to.
//
// Contract:
// - Open() validates the whole header up front: its length (at most kMaxSafetensorsHeaderBytes),
//   the JSON, every entry's fields, every extent
//   against the data section, and (for dtypes whose size is known) that the extent holds exactly
//   prod(shape) elements. Errors name the file and the tensor; nothing here aborts or throws.
// - Tensors whose dtype ReadAsF32 cannot convert (anything but F32, F16, BF16) are still listed,
//   with `supported == false`, so a loader can report Unimplemented naming the tensor and dtype
//   only if it actually needs that tensor.
// - Shapes are in row-major (PyTorch/HF) order: shape[0] is the slowest dimension. A 2-D weight
//   of an `out x in` matrix has shape = {out, in}. Note this is the reverse of GGUF dims.
// - The SafetensorsFile owns the mapping; Tensor::data points into it.
#ifndef LAZYATTN_SERVICES_WORKER_MODEL_SAFETENSORS_FILE_H_
#define LAZYATTN_SERVICES_WORKER_MODEL_SAFETENSORS_FILE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/worker/model/mapped_file.h"

namespace lazyattn {

enum class SafetensorsDtype {
  kF32,
  kF16,
  kBF16,
  kF64,
  kI8,
  kI16,
  kI32,
  kI64,
  kU8,
  kU16,
  kU32,
  kU64,
  kBool,
  kF8E4M3,
  kF8E5M2,
  kUnknown,  // a dtype string this reader does not know; extent checked for range only
};

struct SafetensorsTensor {
  std::string name;
  std::string dtype_name;  // exactly as written in the file, e.g. "BF16"
  SafetensorsDtype dtype = SafetensorsDtype::kUnknown;
  bool supported = false;      // ReadAsF32 can convert it
  std::vector<int64_t> shape;  // row-major, shape[0] slowest; {} for a scalar
  int64_t num_elements = 0;
  const uint8_t* data = nullptr;  // into the mapping; not necessarily aligned
  size_t num_bytes = 0;
};

// The safetensors format's own bound on the JSON header (the reference reader refuses larger).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

class SafetensorsFile {
 public:
  using Tensor = SafetensorsTensor;

  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // Sorted by name.
  const std::vector<Tensor>& tensors() const { return tensors_; }
  // NotFound naming the tensor and the file when absent.
  absl::StatusOr<const Tensor*> FindTensor(std::string_view name) const;

  // Converts `t` (a tensor of this file) to fp32 into `dst`, which must hold t.num_elements
  // floats. Unimplemented naming the tensor and dtype when !t.supported.
  absl::Status ReadAsF32(const Tensor& t, float* dst) const;

 private:
  SafetensorsFile() = default;
  absl::Status ParseHeader();

  std::string path_;
  MappedFile mapping_;
  const uint8_t* map_ = nullptr;  // mapping_.data(), kept short for the parser
  size_t map_size_ = 0;           // mapping_.size()
  std::vector<Tensor> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_MODEL_SAFETENSORS_FILE_H_
