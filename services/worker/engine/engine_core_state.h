// EngineCore's private state types, shared by the files that implement it (engine_core.cc,
// engine_admission.cc, engine_output.cc, engine_load.cc, engine_progress_reports.cc). Not for
// other users: include engine_core.h.
//
// Who owns what: EngineCore::requests_ owns each Request, EngineCore::jobs_ each EncodeJob. Blocks
// are owned through references counted in the block pool: a Segment's `blocks` hold one reference
// each for its request, a job's `blocks` one each for the job. Everything else refers to requests
// and jobs by id.
#ifndef LAZYATTN_SERVICES_WORKER_ENGINE_ENGINE_CORE_STATE_H_
#define LAZYATTN_SERVICES_WORKER_ENGINE_ENGINE_CORE_STATE_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "services/worker/engine/engine_core.h"
#include "services/worker/engine/engine_core_block_table.h"
#include "services/worker/engine/stop_matcher.h"

namespace lazyattn {

// One document being encoded for every request that needs it (one job per document cache key).
struct EngineCore::EncodeJob {
  // A segment that gets the job's blocks when it completes. One request may wait several times,
  // once per segment naming the document.
  struct Waiter {
    RequestId request = 0;
    size_t segment = 0;
    bool operator==(const Waiter&) const = default;
  };
  JobId id = 0;
  DocCacheKey key;
  CacheMode mode = CacheMode::kLazy;
  std::vector<int32_t> tokens;
  int64_t position_base = 0;    // mode block: the global offset (Q and K at base + m); lazy: 0
  std::vector<BlockId> blocks;  // one reference each, held by the job
  int64_t ready = 0;
  std::vector<Waiter> waiters;
  // > 0: in a failed step of several items with a chunk of this many tokens; runs alone next,
  // at most that many (EngineCore, "A failed step").
  int64_t suspect_tokens = 0;
  int64_t length() const { return static_cast<int64_t>(tokens.size()); }
};

struct EngineCore::Segment {
  enum class Kind { kPrefix, kDocument, kQuery };
  Kind kind = Kind::kQuery;
  std::vector<int32_t> tokens;
  int64_t offset = 0;           // global position of tokens[0]
  std::vector<BlockId> blocks;  // one reference each, held by the request
  int64_t ready = 0;            // tokens whose KV is in `blocks`
  DocCacheKey cache_key;        // documents
  JobId job = 0;                // documents being encoded: the job that fills `blocks`
  int64_t length() const { return static_cast<int64_t>(tokens.size()); }
};

struct EngineCore::Request {
  enum class Phase { kWaiting, kPrefill, kDecode, kDone };
  RequestId id = 0;
  PreparedRequest prepared;
  std::vector<Segment> segments;
  // The block table its chunks attend to, kept between steps and extended (TableFor); reset
  // whenever its segments are (ResetTable: admission, preemption, release).
  SequenceBlockTable table;
  Phase phase = Phase::kWaiting;
  bool cancelled = false;
  bool counted = false;    // per-mode lookup counters taken (first admission only)
  bool scheduled = false;  // has a chunk in the current step (not to be preempted)
  // > 0: in a failed step of several items with a chunk of this many tokens; runs alone next,
  // at most that many (EngineCore, "A failed step").
  int64_t suspect_tokens = 0;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<StreamingDecoder> decoder;
  std::unique_ptr<StopMatcher> stop;
  std::vector<int32_t> stop_ids;
  RequestResult result;
  absl::Time submitted;
  absl::Time first_token;
  Segment& query() { return segments.back(); }
  const Segment& query() const { return segments.back(); }
  // The history the penalties count (sampler.h): the question, then what was generated so far.
  // It is the tail of the query segment, which in modes prefix and full also starts with the
  // system prefix and the documents (those count for no penalty in any mode). A view of the
  // query segment's tokens: valid until they change.
  std::span<const int32_t> PenaltyHistory() const {
    const std::vector<int32_t>& t = query().tokens;
    return std::span(t).last(
        std::min(t.size(), prepared.question.size() + result.token_ids.size()));
  }
  // How many of PenaltyHistory()'s tokens are the question (repetition penalty only).
  int64_t PenaltyPromptTokens() const {
    return static_cast<int64_t>(std::min(prepared.question.size(), PenaltyHistory().size()));
  }
  // PenaltyHistory()'s counts (ForwardChunk::penalties), brought current a token at a time;
  // empty for a request without penalties (`row`: its draw's parameters). Valid until the next
  // call.
  std::span<const PenaltyEntry> PenaltyCountsNow(const SamplingRowParams& row) {
    if (!HasPenalties(row)) return {};
    return penalty_counts.Sync(PenaltyHistory(), PenaltyPromptTokens());
  }
  PenaltyCounts penalty_counts;
};

// One chunk of a step and what it belongs to: a request's segment, or an encoding job.
struct EngineCore::Planned {
  RequestId request = 0;
  JobId job = 0;
  size_t segment = 0;
  bool decode = false;
  std::vector<int64_t> slots;
  // An encoding job's table, rebuilt for each chunk. A request's chunk points into the request's
  // own persistent table instead (chunk.block_table, set when planned).
  std::vector<KvBlockEntry> table;
  ForwardChunk chunk;
};

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_ENGINE_ENGINE_CORE_STATE_H_
