#include "services/worker/cache/cache_mode.h"

#include "absl/strings/str_cat.h"

namespace lazyattn {

std::string_view CacheModeName(CacheMode mode) {
  switch (mode) {
    case CacheMode::kFull: return "full";
    case CacheMode::kPrefix: return "prefix";
    case CacheMode::kBlock: return "block";
    case CacheMode::kLazy: return "lazy";
  }
  return "?";
}

absl::StatusOr<CacheMode> ParseCacheMode(std::string_view name) {
  for (CacheMode m : {CacheMode::kFull, CacheMode::kPrefix, CacheMode::kBlock, CacheMode::kLazy}) {
    if (CacheModeName(m) == name) return m;
  }
  return absl::InvalidArgumentError(absl::StrCat("mode: unknown cache mode \"",
                                                 std::string(name),
                                                 "\" (full, prefix, block or lazy)"));
}

}  // namespace lazyattn
