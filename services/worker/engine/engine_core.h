// The serving engine's single-threaded core: continuous batching over a paged KV cache with the
// four cache modes. Engine (engine.h) runs it on its own thread; tests step it directly.
//
// Each Step():
//  1. ends requests that were cancelled or whose deadline passed (their blocks are released);
//  2. admits waiting requests (FCFS) while the KV pool can hold their prompts: reuses the system
//     prefix from the radix tree, looks documents up in the document cache (pinning hits), and
//     joins or starts one encoding job per missing document, so two requests that need the same
//     uncached document encode it once; mode `block` copies a document cached at another offset
//     and re-rotates it instead of recomputing;
//  3. fills a token budget: one token per decoding request, then chunks of document encodings,
//     prefix tails and query prefills (chunked prefill), in arrival order;
//  4. when blocks run out, preempts the most recently admitted request (its blocks are released,
//     it is re-queued and later recomputed from its prompt plus what it generated);
//  5. runs one forward pass over all chunks, samples, streams tokens, finishes requests.
// A decode-only greedy step on a backend that pipelines (EngineOptions::pipeline_decode) is
// launched in 5. and finished at the start of the next Step(), which may launch the following
// decode step first.
//
// Not thread-safe.
#ifndef LAZYATTN_SERVICES_WORKER_ENGINE_ENGINE_CORE_H_
#define LAZYATTN_SERVICES_WORKER_ENGINE_ENGINE_CORE_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/document_key.h"
#include "services/worker/cache/kv_cache_manager.h"
#include "services/worker/engine/engine_stats.h"
#include "services/worker/engine/model_runner.h"
#include "services/worker/engine/request.h"
#include "services/worker/model/model_weights.h"
#include "services/worker/model/tokenizer/tokenizer.h"

namespace lazyattn {

struct EngineOptions {
  int64_t num_kv_blocks = 1024;  // CPU backend built from weights; a given runner brings its own
  int max_batch_tokens = 512;  // tokens per forward step (chunked prefill budget)
  int max_running = 64;        // requests admitted at once
  bool keep_first_logits = false;
  // Engine: token ids of recently tokenized text documents kept for reuse (DocumentTokenCache),
  // at most this many ids in all (4 bytes each); 0 turns the cache off.
  int64_t document_token_cache_tokens = int64_t{1} << 22;
  // Engine: keys of recently seen token-id documents kept for reuse (DocumentKeyMemo), at most
  // this many ids in all; 0 turns the memo off.
  int64_t document_key_memo_tokens = int64_t{1} << 22;
  // Pipelined decode, where the runner supports it (ModelRunner::SupportsPipelinedDecode): an
  // all-greedy decode step is launched and its results read at the next Step(), which first
  // launches the step after it when the batch stays the same (no admissions, cancellations,
  // deadlines or encodings pending), its input tokens taken on the device. The host's work
  // between steps then overlaps the device's. Off only to measure or compare.
  bool pipeline_decode = true;
};

// A tokenized request (Engine::Submit tokenizes and validates).
struct PreparedRequest {
  std::vector<int32_t> system_prefix;
  struct Document {
    std::string id;
    DocumentKey key;
    std::vector<int32_t> tokens;
  };
  std::vector<Document> documents;
  std::vector<int32_t> question;
  CacheMode mode = CacheMode::kLazy;
  SamplingParams sampling;
  absl::Time deadline = absl::InfiniteFuture();
  // When the caller handed the request over (Engine::Submit sets it); TTFT counts from here, so
  // time spent in the inbox while the loop runs a step is included. Unset: when the core adds it.
  absl::Time submitted = absl::InfinitePast();
  RequestCallbacks callbacks;
  int64_t prompt_tokens() const;
};

class EngineCore {
 public:
  // Runs on `runner` (any backend); its KV storage sizes the block pool. Borrowed pointers must
  // outlive the core.
  EngineCore(std::unique_ptr<ModelRunner> runner, const Tokenizer* tokenizer,
             EngineOptions options);
  // The CPU backend with options.num_kv_blocks blocks.
  EngineCore(const ModelWeights* weights, const Tokenizer* tokenizer, EngineOptions options);
  ~EngineCore();  // fails every unfinished request with Unavailable

  // Blocks a prompt plus its generation budget needs at most (for admission control).
  int64_t BlocksNeeded(const PreparedRequest& r) const;
  // Queues a request under `id` (0: the core picks one); returns the id. A request that can never
  // fit ends at once through on_done with ResourceExhausted.
  uint64_t Add(PreparedRequest request, uint64_t id = 0);
  void Cancel(uint64_t id);

  // One scheduling round and forward pass. Returns false when there was nothing to do.
  bool Step(absl::Time now);
  bool HasWork() const { return !waiting_.empty() || !running_.empty(); }
  // The earliest deadline among queued and running requests (for the engine thread's sleep).
  absl::Time NextDeadline() const;

  const EngineStats& stats() const { return stats_; }
  EngineLoad Load() const;
  KvCacheManager& cache() { return cache_; }
  const ModelConfig& config() const { return runner_->config(); }
  const ModelRunner& runner() const { return *runner_; }
  int block_size() const { return cache_.block_size(); }

 private:
  struct Request;
  struct Segment;
  struct EncodeJob;
  struct Planned;

  enum class DocOutcome { kHit, kCopy, kEncode };
  void Admit();
  bool TryAdmit(Request& r);
  DocOutcome AcquireDocument(Request& r, Segment& seg);
  bool EnsureBlocks(std::vector<BlockId>& blocks, int64_t tokens, Request* owner);
  bool PreemptNewest(const Request* keep);
  void Release(Request& r);
  void Finish(Request& r, const absl::Status& status);
  // Emits `chosen` when the runner already picked it (greedy), else samples from `logits`.
  void SampleAndEmit(Request& r, std::span<const float> logits, std::optional<int32_t> chosen);
  void CompleteJob(EncodeJob& job);
  void OnPrefillDone(Request& r, std::span<const float> logits, std::optional<int32_t> chosen);
  std::vector<KvBlockEntry> TableFor(const Request& r, size_t seg, int64_t own_tokens) const;
  // KV slots of tokens start .. start + n - 1 of a segment stored in `blocks`.
  std::vector<int64_t> SlotsFor(const std::vector<BlockId>& blocks, int64_t start,
                                int64_t n) const;
  // The chunks of a plan, their slot and table spans pointing into it.
  static std::vector<ForwardChunk> ChunksOf(std::span<Planned> plan);
  // Reads a step's results: samples, streams, finishes (every request of the plan fails with
  // the status when it is an error). Requests it finishes stay in running_.
  void ApplyResults(std::span<Planned> plan, const absl::StatusOr<ForwardOutput>& output);
  // With `launched` on the device and uncollected: launches the decode step after it when the
  // batch stays the same, and returns its plan; nullopt (nothing launched) otherwise.
  std::optional<std::vector<Planned>> LaunchChainedDecode(std::span<const Planned> launched,
                                                          absl::Time now);

  std::unique_ptr<ModelRunner> runner_;
  const Tokenizer* tokenizer_;
  EngineOptions options_;
  KvCacheManager cache_;
  EngineStats stats_;
  uint64_t next_id_ = 1;
  std::deque<std::unique_ptr<Request>> waiting_;
  std::vector<std::unique_ptr<Request>> running_;  // admission order
  absl::flat_hash_map<DocCacheKey, std::unique_ptr<EncodeJob>> jobs_;
  std::vector<EncodeJob*> job_order_;  // FIFO of jobs_ values
  std::vector<Planned> in_flight_;     // a launched, uncollected decode step (pipeline_decode)
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_ENGINE_ENGINE_CORE_H_
