// Counters of the engine, by cache mode, for the worker's metrics. Formulas (ratios are derived
// from counters, as Prometheus wants them):
//   document hit ratio (tokens)  = doc_hit_tokens / doc_lookup_tokens
//   prefill reuse ratio          = prefill_tokens_reused / (prefill_tokens_reused + computed)
#ifndef LAZYATTN_SERVICES_WORKER_ENGINE_ENGINE_STATS_H_
#define LAZYATTN_SERVICES_WORKER_ENGINE_ENGINE_STATS_H_

#include <array>
#include <cstdint>

#include "services/worker/cache/cache_mode.h"

namespace lazyattn {

struct ModeCounters {
  int64_t requests = 0;
  int64_t doc_lookups = 0;        // documents looked up in the document cache
  int64_t doc_hits = 0;           // ... found there (mode block: at the same offset)
  int64_t doc_copies = 0;         // mode block: found at another offset and copied
  int64_t doc_lookup_tokens = 0;
  int64_t doc_hit_tokens = 0;
  int64_t prefill_tokens_computed = 0;  // prompt and document tokens run through the model
  int64_t prefill_tokens_reused = 0;    // prompt tokens whose KV came from a cache
};

struct EngineStats {
  std::array<ModeCounters, 4> by_mode{};  // indexed by static_cast<int>(CacheMode)
  int64_t steps = 0;
  int64_t preemptions = 0;
  int64_t requests_ok = 0;
  int64_t requests_failed = 0;
  int64_t encode_jobs = 0;  // document encodings completed (one per missing document, shared)
  // Inconsistencies found in the KV block pool (an unref of an unreferenced block, counts that
  // drifted). Any is a bug: the engine then stops serving (EngineCore::health()).
  int64_t pool_errors = 0;
  // Steps the runner failed (a device error); EngineOptions::max_consecutive_step_failures in a
  // row, or one sticky error, stop the engine serving (EngineCore::health()).
  int64_t step_failures = 0;
  // Failed steps of several requests or encodings whose items then ran one per step, so that
  // only the one the runner cannot run fails (EngineCore's "A failed step").
  int64_t steps_isolated = 0;
  // Request preparation (Engine::Submit): text documents tokenized, or whose ids came from the
  // token cache; token-id documents hashed (SHA-256), or whose key came from the key memo.
  int64_t text_docs_tokenized = 0, text_docs_reused = 0;
  int64_t id_docs_hashed = 0, id_docs_reused = 0;
  ModeCounters& mode(CacheMode m) { return by_mode[static_cast<int>(m)]; }
  const ModeCounters& mode(CacheMode m) const { return by_mode[static_cast<int>(m)]; }
};

// What is queued or running now (gauges, for the worker's load report).
struct EngineLoad {
  int running = 0;  // admitted requests
  int waiting = 0;  // submitted, not admitted yet (also preempted ones)
  // Prompt tokens still to compute: waiting requests' prompts less the documents the cache holds
  // or a job encodes (plus what a preempted one had generated), the unfinished segments of
  // admitted ones, each document encoding counted once. Documents the worker already holds are
  // not load: reported to the router, they would make the worker with the hot set look busiest.
  int64_t queued_prefill_tokens = 0;
  // Prompt tokens of the waiting requests alone (bounded by EngineOptions::max_queued_tokens).
  int64_t waiting_tokens = 0;
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_ENGINE_ENGINE_STATS_H_
