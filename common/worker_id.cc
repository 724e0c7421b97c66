#include "common/worker_id.h"

#include <algorithm>

namespace lazyattn {

bool IsWorkerIdChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-' || c == ':' || c == '[' || c == ']';
}

bool IsValidWorkerId(absl::string_view id, size_t max_length) {
  return !id.empty() && id.size() <= max_length &&
         std::all_of(id.begin(), id.end(), IsWorkerIdChar);
}

}  // namespace lazyattn
