// The document keys of token-id documents a worker has hashed recently.
//
// A document's key is a SHA-256 over its token ids (common/document_key.h): ~50-100 us for the
// 80 KB of a 20K-token RAG request, on the submitting thread, before the request reaches the
// engine, every time the same documents come back. The memo finds a repeated document by a fast
// 64-bit hash of its ids (absl::Hash, a few GB/s) and then compares the ids themselves, so a
// collision can only cost a SHA-256, never return a wrong key. Bounded by a token budget, least
// recently used out, each entry charged its ids, its scope words and a fixed overhead for its
// bookkeeping (list node, vectors, index slot: ~250 bytes), so that many one-token documents
// cannot make the memo hold far more memory than its budget says (without the overhead, 4M
// one-token documents under the engine's 4M-id budget took 1.1 GB). Thread-safe.
#ifndef LAZYATTN_SERVICES_WORKER_ENGINE_DOCUMENT_KEY_MEMO_H_
#define LAZYATTN_SERVICES_WORKER_ENGINE_DOCUMENT_KEY_MEMO_H_

#include <cstdint>
#include <functional>
#include <list>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/document_key.h"

namespace lazyattn {

class DocumentKeyMemo {
 public:
  // An entry's bookkeeping, in ids (4 bytes each): about what a list node, two vectors' heap
  // blocks and an index slot take.
  static constexpr int64_t kEntryOverheadTokens = 64;

  // Remembers entries whose ids, scope words and `entry_overhead_tokens` each add up to at most
  // `capacity_tokens` (0: remembers nothing); a document that alone exceeds it is not kept.
  explicit DocumentKeyMemo(int64_t capacity_tokens,
                           int64_t entry_overhead_tokens = kEntryOverheadTokens)
      : capacity_(capacity_tokens), entry_overhead_(entry_overhead_tokens) {}

  // The key of `tokens`: the remembered one when these exact ids were seen in the same `scope`
  // (a request's cache scope words, PrefixScopeWords; empty for the shared scope), else
  // compute() (the SHA-256), which is then remembered. compute() runs outside the lock. Scoped,
  // a memo hit (a SHA-256 saved) cannot tell one scope that another sent the same ids.
  DocumentKey KeyOf(const std::vector<int32_t>& tokens, const std::function<DocumentKey()>& compute,
                    const std::vector<int32_t>& scope = {});

  int64_t tokens() const;   // ids held now
  int64_t entries() const;  // documents held now
  int64_t charged() const;  // what counts against the capacity: ids, scope words, overheads
  int64_t hits() const;     // KeyOf calls answered from memory
  int64_t misses() const;  // KeyOf calls that ran compute()

 private:
  struct Entry {
    uint64_t hash;
    std::vector<int32_t> scope;
    std::vector<int32_t> tokens;
    DocumentKey key;
  };
  using Order = std::list<Entry>;  // most recently used first

  // What an entry of `tokens` ids in `scope` counts against the capacity.
  int64_t ChargeOf(size_t tokens, size_t scope) const {
    return static_cast<int64_t>(tokens + scope) + entry_overhead_;
  }

  const int64_t capacity_;
  const int64_t entry_overhead_;
  mutable absl::Mutex mu_;
  Order order_ ABSL_GUARDED_BY(mu_);
  // Fast hash -> its entries (more than one only on a 64-bit collision).
  absl::flat_hash_map<uint64_t, std::vector<Order::iterator>> index_ ABSL_GUARDED_BY(mu_);
  int64_t tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t charged_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t hits_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t misses_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_ENGINE_DOCUMENT_KEY_MEMO_H_
