// The four cache policies of DESIGN.md section 3, and what each means for where K is rotated.
//
//   full    ordinary causal attention over the whole prompt; reuses only the system prefix.
//   prefix  ordinary causal attention; reuses the longest cached token prefix (radix tree).
//   block   documents encoded alone at their global offset (Block-Attention); KV keyed by
//           (document, offset); a hit at another offset is copied and re-rotated.
//   lazy    documents encoded alone at local positions 0..L-1; KV keyed by document only; the
//           attention kernels rotate by each segment's offset (deferred RoPE).
// `block` and `lazy` compute the same function; `full` is the quality reference.
#ifndef LAZYATTN_SERVICES_WORKER_CACHE_CACHE_MODE_H_
#define LAZYATTN_SERVICES_WORKER_CACHE_CACHE_MODE_H_

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace lazyattn {

enum class CacheMode { kFull, kPrefix, kBlock, kLazy };

std::string_view CacheModeName(CacheMode mode);
// "full", "prefix", "block", "lazy"; InvalidArgument naming the value otherwise.
absl::StatusOr<CacheMode> ParseCacheMode(std::string_view name);

// Documents are separate segments (encoded alone) in these modes.
inline bool EncodesDocumentsAlone(CacheMode m) {
  return m == CacheMode::kBlock || m == CacheMode::kLazy;
}

// For a segment starting at global position `offset`:
// the delta its block-table entries carry (rotation applied at attention time) ...
inline int64_t TableDelta(CacheMode m, int64_t offset) { return m == CacheMode::kLazy ? offset : 0; }
// ... and the position base at which its K is rotated when written (K at base + local).
inline int64_t KRotationBase(CacheMode m, int64_t offset) {
  return m == CacheMode::kLazy ? 0 : offset;
}

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_CACHE_CACHE_MODE_H_
