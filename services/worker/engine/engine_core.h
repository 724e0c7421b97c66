// The serving engine's single-threaded core: continuous batching over a paged KV cache with the
// four cache modes. Engine (engine.h) runs it on its own thread; tests step it directly.
//
// Each Step():
//  1. ends requests that were cancelled or whose deadline passed (their blocks are released);
//  2. admits waiting requests (FCFS) while the KV pool can hold their uncached prompts beside what
//     the requests admitted before them still have to allocate: reuses the system
//     prefix from the radix tree, looks documents up in the document cache (pinning hits), and
//     joins or starts one encoding job per missing document, so two requests that need the same
//     uncached document encode it once; mode `block` copies a document cached at another offset
//     and re-rotates it instead of recomputing;
//  3. fills a token budget: one token per decoding request, then chunks of document encodings,
//     prefix tails and query prefills (chunked prefill), in arrival order; a request's block
//     table persists between its steps and only grows (engine_core_block_table.h), so a decode
//     step's host work does not depend on the context length;
//  4. when blocks run out, preempts the most recently admitted request (its blocks are released,
//     it is re-queued and later recomputed from its prompt plus what it generated);
//  5. runs one forward pass over all chunks, samples, streams tokens, finishes requests.
// A decode-only step (greedy or sampled: the runner draws every row) on a backend that
// pipelines (EngineOptions::pipeline_decode) is launched in 5. and finished at the start of the
// next Step(), which may launch the following decode step first.
//
// Ownership: the core owns every request (requests_) and encoding job (jobs_); everything else
// names them by id (the queues, a job's waiters, a step's plan), so a request that ends while
// others still refer to it is simply not found, never read after it is freed. One request may
// name the same document any number of times: each occurrence is its own segment and its own
// waiter of the one encoding job.
//
// After every step the block pool is checked (its misuse counter and its counts; the whole
// invariant too with EngineOptions::check_pool_every_step). A failed check is a bug: the core
// then fails every request (running ones with Internal, queued ones with Unavailable so a router
// retries them elsewhere), refuses new ones and reports it in health().
//
// A failed step: one the runner fails (Forward, Launch or Collect) is counted
// (EngineStats::step_failures) and nothing of it is applied. One request or encoding alone in the
// step ends with the runner's error (an encoding: every request waiting for it). A step of
// several items does not fail them all for one: each becomes a suspect, and suspects then run
// one per step (at most the tokens of their chunk in the failed step), unpipelined, before
// anything else, until each has either passed a step alone (it is a suspect no more) or failed
// one (it ends). So a request the device cannot run, or a step too large for it, costs the other
// requests of its batch a few steps, not their work (EngineStats::steps_isolated). A launched
// step chained to the failed one is collected and dropped: its input tokens were the failed
// step's.
// The core stops serving the same way as for a broken pool, with an Unavailable health(), when
// EngineOptions::max_consecutive_step_failures ordinary steps in a row fail (a suspect failing
// alone is its own fault and does not count; passing alone does not reset the count, so a
// device that fails every batch stops too), or at once when the runner marks the error sticky
// (common/device_error.h: a corrupt CUDA context fails every later call). Then every request it
// holds, in the failed step, running or queued, ends with Unavailable (the worker's failure, not
// the request's): a router fails over those that have sent nothing to their client yet.
//
// Not thread-safe.
#ifndef LAZYATTN_SERVICES_WORKER_ENGINE_ENGINE_CORE_H_
#define LAZYATTN_SERVICES_WORKER_ENGINE_ENGINE_CORE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/document_key.h"
#include "services/worker/cache/kv_cache_manager.h"
#include "services/worker/engine/engine_stats.h"
#include "services/worker/engine/model_runner.h"
#include "services/worker/engine/request.h"
#include "services/worker/model/model_weights.h"
#include "services/worker/model/tokenizer/tokenizer.h"

namespace lazyattn {

#if !defined(NDEBUG) || defined(__SANITIZE_ADDRESS__)
inline constexpr bool kDebugOrSanitizerBuild = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kDebugOrSanitizerBuild = true;
#else
inline constexpr bool kDebugOrSanitizerBuild = false;
#endif
#else
inline constexpr bool kDebugOrSanitizerBuild = false;
#endif

struct EngineOptions {
  int64_t num_kv_blocks = 1024;  // CPU backend built from weights; a given runner brings its own
  int max_batch_tokens = 512;  // tokens per forward step (chunked prefill budget)
  int max_running = 64;        // requests admitted at once
  bool keep_first_logits = false;
  // Engine: token ids of recently tokenized text documents kept for reuse (DocumentTokenCache),
  // at most this many ids in all (4 bytes each), each document charged 32 more for its
  // bookkeeping; 0 turns the cache off.
  int64_t document_token_cache_tokens = int64_t{1} << 22;
  // Engine: keys of recently seen token-id documents kept for reuse (DocumentKeyMemo), at most
  // this many ids in all, each document charged its scope words and 64 more for its bookkeeping;
  // 0 turns the memo off.
  int64_t document_key_memo_tokens = int64_t{1} << 22;
  // Pipelined decode, where the runner supports it (ModelRunner::SupportsPipelinedDecode): a
  // decode step that asks for no logits is launched and its results read at the next Step(), which first
  // launches the step after it when the batch stays the same (no admissions, cancellations,
  // deadlines or encodings pending), its input tokens taken on the device. The host's work
  // between steps then overlaps the device's. Off only to measure or compare.
  bool pipeline_decode = true;
  // Requests without a client deadline end with DeadlineExceeded this long after submission, so
  // nothing waits forever; InfiniteDuration turns it off.
  absl::Duration default_deadline = absl::Seconds(600);
  // Engine::SubmitPrepared answers ResourceExhausted at once while this many requests, or this many
  // prompt tokens, wait for admission (a request arriving at an empty queue is always queued).
  int max_waiting_requests = 1024;
  int64_t max_queued_tokens = int64_t{1} << 22;
  // Recount the whole KV pool after every step (O(blocks)) and compare every running request's
  // persistent block table with one rebuilt from its segments (O(context)); otherwise only the
  // O(1) checks run.
  bool check_pool_every_step = kDebugOrSanitizerBuild;
  // Failed steps in a row after which the core stops serving (>= 1; YAML
  // engine.max_consecutive_step_failures). A successful step resets the count.
  int max_consecutive_step_failures = 3;
};

// A tokenized request (Engine::Submit tokenizes and validates).
struct PreparedRequest {
  std::vector<int32_t> system_prefix;
  struct Document {
    std::string id;
    DocumentKey key;  // scoped (ScopedDocumentKey) by the request's cache scope
    std::vector<int32_t> tokens;
  };
  std::vector<Document> documents;
  std::vector<int32_t> question;
  // The request's cache scope words (PrefixScopeWords): its prefixes are matched and cached
  // under them. Empty: the shared scope.
  std::vector<int32_t> prefix_scope;
  CacheMode mode = CacheMode::kLazy;
  SamplingParams sampling;
  bool prefetch = false;  // EngineRequest::prefetch
  // A MonotonicNow() value (common/monotonic_time.h), as every time the engine keeps.
  absl::Time deadline = absl::InfiniteFuture();
  // When the caller handed the request over (Engine::Submit sets it); TTFT counts from here, so
  // time spent in the inbox while the loop runs a step is included. Unset: when the core adds it.
  absl::Time submitted = absl::InfinitePast();
  RequestCallbacks callbacks;
  int64_t prompt_tokens() const;
};

// OK, or InvalidArgument naming the first part of `r` the model cannot compute: a token outside
// the vocabulary, a document of no tokens in a mode that encodes documents alone (lazy, block),
// an empty question, a prompt that fills the context.
// PrepareRequest checks these with the request's own field names; EngineCore::Add checks again,
// so a request prepared by any other path cannot take down the core.
absl::Status CheckPreparedRequest(const PreparedRequest& r, const ModelConfig& config);

// The message for a prompt of `r` that fills the context: "prompt: N tokens leave no room ...",
// or for a Prefetch "documents: N tokens together leave no room ...".
std::string PromptTooLongMessage(const PreparedRequest& r, const ModelConfig& config);

// The prompt tokens `p` will compute (its share of a worker's queued prefill load): prompt_tokens()
// less the documents `reused(key, tokens)` says need no encoding, keyed as admission keys them
// (mode lazy: position-free; block: at the offset the request places them), in request order.
// Modes prefix and full: all of prompt_tokens() (the prefix tree's share is not estimated).
// `reused` may record the keys it sees, so a document shared by queued requests counts once.
int64_t PrefillTokensToCompute(
    const PreparedRequest& p, const std::function<bool(const DocCacheKey&, int64_t)>& reused);

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
  // Queues a request under `id` (0: the core picks one); returns the id. Ends at once through
  // on_done: with InvalidArgument a request CheckPreparedRequest refuses, FailedPrecondition one
  // that can never fit (more blocks than the pool has), AlreadyExists an id in use, Unavailable
  // anything once health() is not OK. A request without a deadline gets
  // EngineOptions::default_deadline.
  uint64_t Add(PreparedRequest request, uint64_t id = 0);
  void Cancel(uint64_t id);
  // For a drain: from the next Step() on, every request that has not started (waiting for
  // admission with no token generated: never admitted, or preempted before its first token) ends
  // with `why` instead of being admitted, now and whenever one is added or preempted later.
  // Running requests go on as usual. Irreversible; `why` must not be OK.
  void EndUnstarted(const absl::Status& why) { end_unstarted_ = why; }

  // One scheduling round and forward pass. Returns false when there was nothing to do.
  bool Step(absl::Time now);
  bool HasWork() const { return !requests_.empty(); }
  // OK, or why the core stopped serving: Internal for a broken pool, Unavailable for failed
  // steps (see above). Never OK again.
  const absl::Status& health() const { return health_; }
  // The earliest deadline among queued and running requests (for the engine thread's sleep).
  absl::Time NextDeadline() const;

  const EngineStats& stats() const { return stats_; }
  EngineLoad Load() const;
  // What the engine publishes after every step: Load(), except that once more than
  // kExactLoadWaiting requests wait, queued_prefill_tokens (a cache lookup per waiting request's
  // document: ~0.2 ms at 1,024 waiting of 5 documents each, more with more documents) is
  // recomputed at most every kLoadEstimateInterval and
  // carried over between. The counts and waiting_tokens are always current.
  EngineLoad PublishedLoad(absl::Time now);
  static constexpr int kExactLoadWaiting = 64;
  static constexpr absl::Duration kLoadEstimateInterval = absl::Milliseconds(50);
  // How often waiting requests hear that the engine works through their queue
  // (RequestCallbacks::on_queued): well inside a router's first-token timeout (seconds).
  static constexpr absl::Duration kQueuedReportInterval = absl::Milliseconds(500);
  KvCacheManager& cache() { return cache_; }
  const ModelConfig& config() const { return runner_->config(); }
  const ModelRunner& runner() const { return *runner_; }
  int block_size() const { return cache_.block_size(); }

 private:
  struct Request;
  struct Segment;
  struct EncodeJob;
  struct Planned;
  using RequestId = uint64_t;  // 0: none
  using JobId = uint64_t;      // 0: none

  enum class DocOutcome { kHit, kCopy, kEncode };
  // nullptr when the request ended (or never existed): ids may outlive what they name.
  Request* FindRequest(RequestId id);
  EncodeJob* FindJob(JobId id);

  // --- engine_admission.cc: admission, blocks, preemption, release.
  // Whether `r` is to end now with end_unstarted_ (see EndUnstarted).
  bool EndsUnstarted(const Request& r) const;
  void Admit();
  // Blocks that admitted work has still to allocate for its prompts (running prefills and
  // encoding jobs): admission keeps them free.
  int64_t OutstandingPrefillBlocks() const;
  // Admits `r` when the pool can hold what it still needs beside `reserved` blocks; returns
  // what it needs (now reserved too), or nullopt with nothing held.
  std::optional<int64_t> TryAdmit(Request& r, int64_t reserved);
  // A block-mode document to be copied from an entry at another offset once admission has room
  // for it: the source's blocks are pinned until then.
  struct PendingCopy {
    size_t segment;
    std::vector<BlockId> source;
    int64_t source_offset;  // 0 for a position-free entry (its keys are at local positions)
  };
  // A hit (pinned), a copy to make (appended to `copies`, its source pinned), or an encoding job
  // started or joined. `repeat`: an earlier segment of the request has the same key (a lazy
  // request naming the document twice), whose reuse is counted cached, not as a hit.
  DocOutcome AcquireDocument(Request& r, size_t segment, bool repeat,
                             std::vector<PendingCopy>& copies);
  DocOutcome StartOrJoinJob(Request& r, size_t segment);
  // Makes the copy into new blocks, or (no free blocks, a device error) starts or joins a job for
  // the document instead; unpins the source either way.
  DocOutcome MakeCopy(Request& r, const PendingCopy& copy);
  bool EnsureBlocks(std::vector<BlockId>& blocks, int64_t tokens, RequestId owner);
  bool PreemptNewest(RequestId keep);
  // Returns every block `r` holds and leaves every job it waits for (a job nobody waits for any
  // more is dropped with its blocks).
  void Release(Request& r);
  void LeaveJob(JobId job, RequestId request, size_t segment);
  // Ends `r` (on_done is called); it is erased from the queues by EraseFinished.
  void Finish(Request& r, const absl::Status& status);
  void EraseFinished();
  void CompleteJob(EncodeJob& job);
  // Ends every request waiting for `job` with `status` (which drops the job).
  void FailJob(JobId job, const absl::Status& status);

  // --- engine_output.cc: sampling, streaming, finishing.
  // `chosen`/`logprob`: the runner's draw and its log-probability; without `chosen` the host
  // draws from `logits`.
  void SampleAndEmit(Request& r, std::span<const float> logits, std::optional<int32_t> chosen,
                     float logprob);
  void OnPrefillDone(Request& r, std::span<const float> logits, std::optional<int32_t> chosen,
                     float logprob);

  // --- engine_core.cc: the step.
  bool RunStep(absl::Time now);
  // The pool checks described above; on failure, everything fails and health_ is set.
  void VerifyPool();
  // Sets health_ to `why` and ends every request: queued ones with Unavailable, running ones with
  // Unavailable too when `running_unavailable`, else with `why`.
  void StopServing(const absl::Status& why, bool running_unavailable);
  // Reads a step's results: samples, streams, finishes. On an error, the live items of an
  // ordinary step of several become suspects; otherwise its item fails (and every request
  // waiting for it, if an encoding), or with the core stopping everything fails (the file
  // comment, "A failed step"). `isolated`: the plan was one suspect alone (PlanScope::kOneSuspect).
  void ApplyResults(std::span<Planned> plan, const absl::StatusOr<ForwardOutput>& output,
                    bool isolated = false);
  // With `launched` on the device and uncollected: launches the decode step after it when the
  // batch stays the same, and returns its plan; nullopt (nothing launched) otherwise.
  std::optional<std::vector<Planned>> LaunchChainedDecode(std::span<const Planned> launched,
                                                          absl::Time now);

  // --- engine_plan.cc: what a step computes.
  // A request or job of a failed step awaits its step alone (the file comment, "A failed step").
  bool HasSuspects() const;
  enum class PlanScope {
    kOneSuspect,      // the first suspect that can run now, alone; nothing if none can
    kAllButSuspects,  // decodes, encodings and prefills under the token budget, suspects left out
  };
  // Plans the next step (blocks allocated, preempting the newest request when short; chunks'
  // requests and waiters of encoded jobs marked scheduled).
  std::vector<Planned> PlanBatch(PlanScope scope);
  // Appends `n` tokens of r's segment `si` to `plan`.
  void PlanSegment(Request& r, size_t si, int64_t n, bool decode, std::vector<Planned>& plan);
  // Extends r's persistent table to segments [0, seg) and own_tokens tokens of segment seg, and
  // points `chunk` at a new version of it (block_table and the table_* fields). O(entries added),
  // not O(context).
  void TableFor(Request& r, size_t seg, int64_t own_tokens, ForwardChunk& chunk);
  // The same table built from scratch: the reference every persistent table is checked against
  // (check_pool_every_step).
  std::vector<KvBlockEntry> RebuildTable(const Request& r, size_t seg, int64_t own_tokens) const;
  // Empties r's table under a new sequence id (its segments are about to be rebuilt or dropped).
  void ResetTable(Request& r);
  // KV slots of tokens start .. start + n - 1 of a segment stored in `blocks`.
  std::vector<int64_t> SlotsFor(const std::vector<BlockId>& blocks, int64_t start,
                                int64_t n) const;
  // The chunks of a plan, their slot and table spans pointing into it.
  static std::vector<ForwardChunk> ChunksOf(std::span<Planned> plan);

  // --- engine_progress_reports.cc: signs of life before the first token.
  // RequestCallbacks::on_prefill_progress for `requests` (ids, repeats allowed) still before
  // their first token.
  void ReportPrefillProgress(std::vector<RequestId>& requests);
  // RequestCallbacks::on_queued for every request before its first token, at most once
  // per kQueuedReportInterval (called after a step that applied a forward pass's results).
  void ReportQueued(absl::Time now);

  std::unique_ptr<ModelRunner> runner_;
  const Tokenizer* tokenizer_;
  EngineOptions options_;
  KvCacheManager cache_;
  EngineStats stats_;
  RequestId next_id_ = 1;
  JobId next_job_id_ = 1;
  uint64_t next_table_sequence_ = 1;  // ForwardChunk::table_sequence, never reused
  absl::flat_hash_map<RequestId, std::unique_ptr<Request>> requests_;  // queued and running
  std::deque<RequestId> waiting_;   // admission order (a preempted request goes first)
  std::vector<RequestId> running_;  // admitted, in admission order
  std::map<JobId, std::unique_ptr<EncodeJob>> jobs_;  // by id, which is their start order
  absl::flat_hash_map<DocCacheKey, JobId> job_by_key_;
  std::vector<Planned> in_flight_;  // a launched, uncollected decode step (pipeline_decode)
  int consecutive_step_failures_ = 0;
  absl::Status health_;
  absl::Status end_unstarted_;  // OK: requests are admitted (see EndUnstarted)
  // PublishedLoad's last estimate of the queued prefill, and when it is due again.
  int64_t published_prefill_tokens_ = 0;
  absl::Time next_prefill_estimate_ = absl::InfinitePast();
  absl::Time last_queued_report_ = absl::InfinitePast();
  bool step_computed_ = false;  // this Step applied the results of a forward pass
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_ENGINE_ENGINE_CORE_H_
