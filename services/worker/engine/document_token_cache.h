// Token ids of the text documents a worker has tokenized recently, by document key.
//
// A RAG request names its documents by text; turning 20K tokens of text into ids costs ~2 ms of
// BPE work on the submitting thread (tools/bench/engine_overhead_bench.cc measures it), more
// than an all-cached request's whole GPU step at batch 1 would add. The document key already
// names the tokenizer and the exact text (common/document_key.h: SHA-256 over both), so a
// document seen before can reuse its ids. Bounded by a token budget, least recently used out,
// each entry charged its ids and a fixed overhead for its bookkeeping, so that many one-token
// documents cannot make the cache hold far more memory than its budget says.
// Thread-safe: Submit prepares requests on the callers' threads.
#ifndef LAZYATTN_SERVICES_WORKER_ENGINE_DOCUMENT_TOKEN_CACHE_H_
#define LAZYATTN_SERVICES_WORKER_ENGINE_DOCUMENT_TOKEN_CACHE_H_

#include <cstdint>
#include <list>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/document_key.h"

namespace lazyattn {

class DocumentTokenCache {
 public:
  // An entry's bookkeeping, in ids (4 bytes each): about what a list node, the ids' heap block
  // and an index slot take (~100 bytes measured a one-token entry, rounded up).
  static constexpr int64_t kEntryOverheadTokens = 32;

  // Holds entries whose ids and `entry_overhead_tokens` each add up to at most `capacity_tokens`
  // (0: caches nothing). A document that alone exceeds it is not cached.
  explicit DocumentTokenCache(int64_t capacity_tokens,
                              int64_t entry_overhead_tokens = kEntryOverheadTokens)
      : capacity_(capacity_tokens), entry_overhead_(entry_overhead_tokens) {}

  // A copy of the ids stored under `key` (and it becomes the most recently used), or nullopt.
  std::optional<std::vector<int32_t>> Find(const DocumentKey& key);
  // Stores `tokens` under `key` (replacing what was there), then drops least recently used
  // entries until the total fits the capacity.
  void Insert(const DocumentKey& key, std::vector<int32_t> tokens);

  int64_t tokens() const;   // ids held now
  int64_t entries() const;  // documents held now
  int64_t charged() const;  // what counts against the capacity: ids and overheads
  int64_t hits() const;     // Find calls that found their key
  int64_t misses() const;   // Find calls that did not

 private:
  struct Entry {
    DocumentKey key;
    std::vector<int32_t> tokens;
  };
  using Order = std::list<Entry>;  // most recently used first

  const int64_t capacity_;
  const int64_t entry_overhead_;
  mutable absl::Mutex mu_;
  Order order_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<DocumentKey, Order::iterator> index_ ABSL_GUARDED_BY(mu_);
  int64_t tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t charged_ ABSL_GUARDED_BY(mu_) = 0;  // tokens_ + entries x entry_overhead_
  int64_t hits_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t misses_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_ENGINE_DOCUMENT_TOKEN_CACHE_H_
