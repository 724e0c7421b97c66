// The document keys of token-id documents a worker has hashed recently.
//
// A document's key is a SHA-256 over its token ids (common/document_key.h): ~50-100 us for the
// 80 KB of a 20K-token RAG request, on the submitting thread, before the request reaches the
// engine, every time the same documents come back. The memo finds a repeated document by a fast
// 64-bit hash of its ids (absl::Hash, a few GB/s) and then compares the ids themselves, so a
// collision can only cost a SHA-256, never return a wrong key. Bounded by a token budget, least
// recently used out. Thread-safe.
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
  // Remembers at most `capacity_tokens` ids in all (0: remembers nothing).
  explicit DocumentKeyMemo(int64_t capacity_tokens) : capacity_(capacity_tokens) {}

  // The key of `tokens`: the remembered one when these exact ids were seen in the same `scope`
  // (a request's cache scope words, PrefixScopeWords; empty for the shared scope), else
  // compute() (the SHA-256), which is then remembered. compute() runs outside the lock. Scoped,
  // a memo hit (a SHA-256 saved) cannot tell one scope that another sent the same ids.
  DocumentKey KeyOf(const std::vector<int32_t>& tokens, const std::function<DocumentKey()>& compute,
                    const std::vector<int32_t>& scope = {});

  int64_t tokens() const;
  int64_t hits() const;    // KeyOf calls answered from memory
  int64_t misses() const;  // KeyOf calls that ran compute()

 private:
  struct Entry {
    uint64_t hash;
    std::vector<int32_t> scope;
    std::vector<int32_t> tokens;
    DocumentKey key;
  };
  using Order = std::list<Entry>;  // most recently used first

  const int64_t capacity_;
  mutable absl::Mutex mu_;
  Order order_ ABSL_GUARDED_BY(mu_);
  // Fast hash -> its entries (more than one only on a 64-bit collision).
  absl::flat_hash_map<uint64_t, std::vector<Order::iterator>> index_ ABSL_GUARDED_BY(mu_);
  int64_t tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t hits_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t misses_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_ENGINE_DOCUMENT_KEY_MEMO_H_
