#include "services/worker/model/tensor_extents.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace lazyattn {

absl::Status CheckTensorsDisjoint(const std::string& path, std::vector<TensorExtent> extents) {
  std::erase_if(extents, [](const TensorExtent& e) { return e.bytes == 0; });
  std::sort(extents.begin(), extents.end(), [](const TensorExtent& a, const TensorExtent& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.name < b.name;
  });
  for (size_t i = 1; i < extents.size(); ++i) {
    const TensorExtent& before = extents[i - 1];
    const TensorExtent& e = extents[i];
    // before.begin + before.bytes cannot overflow: both lie inside the data section.
    if (e.begin < before.begin + before.bytes) {
      return absl::DataLossError(absl::StrCat(
          path, ": tensor '", std::string(e.name), "' data [", e.begin, ", +", e.bytes, ") overlaps tensor '",
          std::string(before.name), "' data [", before.begin, ", +", before.bytes,
          ") (corrupt file: each tensor's bytes are its own)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace lazyattn
