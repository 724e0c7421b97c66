// Where a model file's tensors lie in its data section, and the check that no two of them share
// a byte. The loaders copy (and convert) every tensor they use; a corrupt file whose tensors all
// start at one offset would pass every in-bounds check yet make a few megabytes of file claim
// tens of gigabytes of weights, and the copies would be killed by the kernel's OOM killer rather
// than refused. Disjoint extents bound the weights by the file's size.
#ifndef LAZYATTN_SERVICES_WORKER_MODEL_TENSOR_EXTENTS_H_
#define LAZYATTN_SERVICES_WORKER_MODEL_TENSOR_EXTENTS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace lazyattn {

struct TensorExtent {
  std::string_view name;  // the tensor's name, for the message (must outlive the call)
  uint64_t begin = 0;     // offset in the data section
  uint64_t bytes = 0;     // empty tensors overlap nothing
};

// OK when no two non-empty extents overlap; otherwise DataLoss naming `path` and both tensors.
// Each extent must already lie inside the data section. O(n log n).
absl::Status CheckTensorsDisjoint(const std::string& path, std::vector<TensorExtent> extents);

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_MODEL_TENSOR_EXTENTS_H_
