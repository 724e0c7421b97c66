#include "tools/cachesim/replay.h"

#include <algorithm>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/document_key.h"
#include "services/worker/cache/kv_cache_manager.h"

namespace lazyattn {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

class Replayer {
 public:
  Replayer(const Trace& trace, const ReplayOptions& options)
      : trace_(trace), o_(options), kv_(options.num_blocks, options.block_size) {
    kv_.documents().set_listener([this](const DocCacheKey&, int64_t, bool stored) {
      if (!stored) ++stats_.evicted_docs;
    });
    int64_t longest = 0;
    for (const TraceRequest& r : trace.requests) longest = std::max(longest, r.system_tokens);
    system_ = trace.SystemTokens(longest);
  }

  absl::StatusOr<ReplayStats> Run();

 private:
  ReplayStats RunPrefix(int64_t i, uint64_t now);
  ReplayStats RunDocuments(int64_t i, uint64_t now);  // modes block and lazy
  // The shared system prompt through the radix tree (every mode but prefix, which matches the
  // whole prompt): reuse what is cached, compute and insert the rest.
  void RunSystem(int64_t tokens, uint64_t now);
  // n blocks, all or none; they stay referenced until Release().
  bool AllocateAll(int64_t n, std::vector<BlockId>* out);
  // As many of n blocks as can be had, in order.
  void AllocateUpTo(int64_t n, std::vector<BlockId>* out);
  void Pin(const std::vector<BlockId>& blocks);
  void Release();
  const DocumentKey& DocKey(int64_t doc);
  absl::Status Check(int64_t request);

  const Trace& trace_;
  const ReplayOptions o_;
  KvCacheManager kv_;
  std::vector<int32_t> system_;
  std::vector<BlockId> held_;  // one reference each, dropped when the request finishes
  absl::flat_hash_map<int64_t, DocumentKey> keys_;
  ReplayStats stats_;
  int64_t failed_allocations_ = 0;
};

const DocumentKey& Replayer::DocKey(int64_t doc) {
  auto it = keys_.find(doc);
  if (it == keys_.end()) {
    // The engine's own content key, over the document's token ids.
    it = keys_
             .emplace(doc, DocumentKeyFromTokens("cachesim-model", "cachesim-tokenizer",
                                                 trace_.DocumentTokens(doc)))
             .first;
  }
  return it->second;
}

bool Replayer::AllocateAll(int64_t n, std::vector<BlockId>* out) {
  std::vector<BlockId> got;
  got.reserve(n);
  for (int64_t j = 0; j < n; ++j) {
    std::optional<BlockId> b = kv_.Allocate();
    if (!b) {
      for (BlockId x : got) kv_.pool().Unref(x);  // never cached: straight back to the free list
      failed_allocations_ += n - j;
      return false;
    }
    got.push_back(*b);
  }
  out->insert(out->end(), got.begin(), got.end());
  held_.insert(held_.end(), got.begin(), got.end());
  return true;
}

void Replayer::AllocateUpTo(int64_t n, std::vector<BlockId>* out) {
  for (int64_t j = 0; j < n; ++j) {
    std::optional<BlockId> b = kv_.Allocate();
    if (!b) {
      failed_allocations_ += n - j;
      return;
    }
    out->push_back(*b);
    held_.push_back(*b);
  }
}

void Replayer::Pin(const std::vector<BlockId>& blocks) {
  for (BlockId b : blocks) {
    kv_.pool().Ref(b);
    held_.push_back(b);
  }
}

void Replayer::Release() {
  for (BlockId b : held_) kv_.pool().Unref(b);
  held_.clear();
}

void Replayer::RunSystem(int64_t tokens, uint64_t now) {
  if (tokens == 0) return;
  const std::span<const int32_t> system(system_.data(), tokens);
  PrefixCache::Match match = kv_.prefixes().MatchAndPin(system, tokens, now);
  held_.insert(held_.end(), match.blocks.begin(), match.blocks.end());
  std::vector<BlockId> blocks = std::move(match.blocks);
  AllocateUpTo(CeilDiv(tokens, o_.block_size) - static_cast<int64_t>(blocks.size()), &blocks);
  kv_.prefixes().Insert(system, blocks, now);
}

ReplayStats Replayer::RunDocuments(int64_t i, uint64_t now) {
  const TraceRequest& r = trace_.requests[i];
  const bool lazy = o_.mode == CacheMode::kLazy;
  ReplayStats c;
  RunSystem(r.system_tokens, now);
  // Pass 1: look every document up and pin what will be read (hits and copy sources).
  struct Pending {
    DocCacheKey key;
    int64_t tokens;
    bool copy;
  };
  std::vector<Pending> pending;
  int64_t offset = r.system_tokens;
  for (int64_t d : r.docs) {
    const int64_t len = trace_.doc_tokens[d];
    ++c.doc_refs;
    c.doc_tokens += len;
    const DocCacheKey key{DocKey(d), lazy ? DocCacheKey::kAnyOffset : offset};
    offset += len;
    if (const CachedDocument* hit = kv_.documents().Lookup(key)) {
      Pin(hit->blocks);
      ++c.hit_refs;
      c.hit_tokens += len;
      continue;
    }
    bool copy = false;
    DocCacheKey source;
    if (!lazy) {
      // The engine's copy source: the same document at its lowest cached offset.
      if (const CachedDocument* src = kv_.documents().FindAnyOffset(key.doc, &source)) {
        Pin(src->blocks);
        copy = true;
      }
    }
    pending.push_back({key, len, copy});
  }
  // Pass 2: compute (or copy) the rest into new blocks and cache them.
  for (const Pending& p : pending) {
    std::vector<BlockId> blocks;
    if (!AllocateAll(CeilDiv(p.tokens, o_.block_size), &blocks)) {
      ++c.uncached_refs;
      continue;
    }
    if (p.copy) {
      ++c.copy_refs;
      c.copy_tokens += p.tokens;
    }
    kv_.documents().Insert(p.key, std::move(blocks), p.tokens);  // documents are distinct
  }
  std::vector<BlockId> question;
  AllocateAll(CeilDiv(r.question_tokens, o_.block_size), &question);
  Release();
  return c;
}

ReplayStats Replayer::RunPrefix(int64_t i, uint64_t now) {
  const TraceRequest& r = trace_.requests[i];
  ReplayStats c;
  std::vector<int32_t> prompt(system_.begin(), system_.begin() + r.system_tokens);
  std::vector<int64_t> doc_end;  // prompt position where each document ends
  for (int64_t d : r.docs) {
    const std::vector<int32_t> t = trace_.DocumentTokens(d);
    prompt.insert(prompt.end(), t.begin(), t.end());
    doc_end.push_back(static_cast<int64_t>(prompt.size()));
    ++c.doc_refs;
    c.doc_tokens += static_cast<int64_t>(t.size());
  }
  const std::vector<int32_t> q = trace_.QuestionTokens(i);
  prompt.insert(prompt.end(), q.begin(), q.end());

  const int64_t n = static_cast<int64_t>(prompt.size());
  PrefixCache::Match match = kv_.prefixes().MatchAndPin(prompt, n - 1, now);
  held_.insert(held_.end(), match.blocks.begin(), match.blocks.end());
  const int64_t docs_begin = r.system_tokens, docs_end = doc_end.back();
  c.hit_tokens = std::clamp(match.num_tokens, docs_begin, docs_end) - docs_begin;
  for (int64_t end : doc_end) c.hit_refs += match.num_tokens >= end ? 1 : 0;

  std::vector<BlockId> blocks = std::move(match.blocks);
  AllocateUpTo(CeilDiv(n, o_.block_size) - static_cast<int64_t>(blocks.size()), &blocks);
  kv_.prefixes().Insert(prompt, blocks, now);
  Release();
  return c;
}

absl::Status Replayer::Check(int64_t request) {
  ++stats_.invariant_checks;
  absl::Status s = kv_.CheckInvariant();
  if (s.ok() && kv_.pool().num_referenced() != 0) {
    s = absl::InternalError(
        absl::StrCat(kv_.pool().num_referenced(), " blocks still referenced between requests"));
  }
  if (s.ok()) return s;
  return absl::InternalError(absl::StrCat("cache invariant broken after request ", request,
                                          " (mode ", std::string(CacheModeName(o_.mode)),
                                          "): ", s.message()));
}

absl::StatusOr<ReplayStats> Replayer::Run() {
  const int64_t n = static_cast<int64_t>(trace_.requests.size());
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t now = kv_.Tick();
    const ReplayStats c = o_.mode == CacheMode::kPrefix ? RunPrefix(i, now) : RunDocuments(i, now);
    if (i >= o_.warmup_requests) {
      ++stats_.requests;
      stats_.doc_refs += c.doc_refs;
      stats_.doc_tokens += c.doc_tokens;
      stats_.hit_refs += c.hit_refs;
      stats_.hit_tokens += c.hit_tokens;
      stats_.copy_refs += c.copy_refs;
      stats_.copy_tokens += c.copy_tokens;
      stats_.uncached_refs += c.uncached_refs;
    }
    if (o_.check_every > 0 && (i + 1) % o_.check_every == 0) {
      if (absl::Status s = Check(i); !s.ok()) return s;
    }
  }
  if (absl::Status s = Check(n - 1); !s.ok()) return s;
  stats_.cached_docs_end = kv_.documents().num_entries();
  stats_.prefix_blocks_end = kv_.prefixes().num_blocks();
  stats_.failed_allocations = failed_allocations_;
  return stats_;
}

}  // namespace

absl::StatusOr<ReplayStats> Replay(const Trace& trace, const ReplayOptions& options) {
  if (options.mode != CacheMode::kPrefix && options.mode != CacheMode::kBlock &&
      options.mode != CacheMode::kLazy) {
    return absl::InvalidArgumentError(
        absl::StrCat("--modes: the simulator replays prefix, block and lazy, not \"",
                     std::string(CacheModeName(options.mode)), "\""));
  }
  if (options.num_blocks < 1) {
    return absl::InvalidArgumentError("--budgets: the budget holds no KV block");
  }
  if (options.block_size < 1) return absl::InvalidArgumentError("--block-size must be >= 1");
  if (options.check_every < 0) return absl::InvalidArgumentError("--check-every must be >= 0");
  if (options.warmup_requests < 0) return absl::InvalidArgumentError("--warmup must be >= 0");
  if (trace.requests.empty()) return absl::InvalidArgumentError("the trace has no requests");
  Replayer replayer(trace, options);
  return replayer.Run();
}

}  // namespace lazyattn
