// Replays a trace against one cache mode using the worker's own cache classes (KvCacheManager:
// BlockPool, DocumentCache, PrefixCache), one request at a time, and counts document-token hits.
//
// Per request, in prompt order [system][doc_1 .. doc_k][question]:
//   prefix  radix-tree match of the whole prompt (capped at its length - 1: the last token is
//           always computed); hit = matched tokens inside the documents part; blocks for the rest
//           are allocated and the prompt's full blocks inserted.
//   block   system prompt through the radix tree; each document looked up under (doc, global
//           offset). Hit = same document at the same offset. A miss whose document is cached at
//           another offset is a "copy" (the engine re-rotates that entry into new blocks): counted
//           apart from hits, it allocates blocks and is inserted under its own offset.
//   lazy    system prompt through the radix tree; documents under (doc, kAnyOffset).
// Hits (and copy sources) are pinned before anything is allocated, so a request never evicts what
// it is about to read. Every block a request reads or writes stays referenced until it finishes,
// then is released; the question's blocks are freed. A document that cannot get blocks even after
// eviction is a miss and is not cached (counted in `uncached_refs`).
#ifndef LAZYATTN_TOOLS_CACHESIM_REPLAY_H_
#define LAZYATTN_TOOLS_CACHESIM_REPLAY_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "services/worker/cache/cache_mode.h"
#include "tools/cachesim/trace.h"

namespace lazyattn {

struct ReplayOptions {
  CacheMode mode = CacheMode::kLazy;
  int64_t num_blocks = 0;
  int block_size = 16;
  int64_t check_every = 1000;   // KvCacheManager::CheckInvariant() period; always at the end
  int64_t warmup_requests = 0;  // requests replayed but left out of the counts
};

struct ReplayStats {
  int64_t requests = 0;  // counted (after warm-up)
  int64_t doc_refs = 0;
  int64_t doc_tokens = 0;
  int64_t hit_refs = 0;  // prefix: documents matched in full
  int64_t hit_tokens = 0;
  int64_t copy_refs = 0;  // block only
  int64_t copy_tokens = 0;
  int64_t uncached_refs = 0;       // misses that could not get blocks
  int64_t evicted_docs = 0;        // document-cache entries evicted (whole replay)
  int64_t cached_docs_end = 0;     // document-cache entries at the end
  int64_t prefix_blocks_end = 0;   // radix-tree blocks at the end
  int64_t failed_allocations = 0;  // blocks asked for that eviction could not provide
  int64_t invariant_checks = 0;

  double HitRatio() const { return Ratio(hit_tokens); }
  double CopyRatio() const { return Ratio(copy_tokens); }

 private:
  double Ratio(int64_t t) const {
    return doc_tokens == 0 ? 0.0 : static_cast<double>(t) / doc_tokens;
  }
};

// InvalidArgument for bad options (mode `full`, no blocks); Internal, naming the request, when
// the cache invariant breaks.
absl::StatusOr<ReplayStats> Replay(const Trace& trace, const ReplayOptions& options);

}  // namespace lazyattn

#endif  // LAZYATTN_TOOLS_CACHESIM_REPLAY_H_
