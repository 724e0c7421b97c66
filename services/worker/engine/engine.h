// The serving engine: one loop thread that owns an EngineCore, and a thread-safe submission API.
// Requests are validated and tokenized on the submitting thread; tokens stream back through the
// request's callbacks, which run on the engine thread.
#ifndef LAZYATTN_SERVICES_WORKER_ENGINE_ENGINE_H_
#define LAZYATTN_SERVICES_WORKER_ENGINE_ENGINE_H_

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "services/worker/engine/cache_events.h"
#include "services/worker/engine/engine_core.h"
#include "services/worker/engine/request_prep.h"

namespace lazyattn {

struct KvBlockCounts {
  int64_t total = 0, free = 0, referenced = 0, cached = 0;
};

class Engine {
 public:
  // Runs on `runner` (any backend). `model_fingerprint` (ModelFingerprint of the weights it
  // serves) keys its cached documents. The tokenizer must outlive the engine. Starts the loop
  // thread.
  Engine(std::unique_ptr<ModelRunner> runner, std::string model_fingerprint,
         const Tokenizer* tokenizer, EngineOptions options, RequestLimits limits = {});
  // The CPU backend over `weights` (borrowed, must outlive the engine).
  Engine(const ModelWeights* weights, const Tokenizer* tokenizer, EngineOptions options,
         RequestLimits limits = {});
  // Stops the loop; unfinished requests end with Unavailable.
  ~Engine();

  // Validates and queues: Prepare, then SubmitPrepared. Errors are returned here and the callbacks
  // are not called; otherwise on_done is called exactly once, later.
  absl::StatusOr<uint64_t> Submit(const EngineRequest& request, RequestCallbacks callbacks);
  // Validation and tokenization alone (InvalidArgument naming the field). Thread-safe; runs on the
  // caller's thread, so callers keep large documents off latency-sensitive threads with a pool.
  absl::StatusOr<PreparedRequest> Prepare(const EngineRequest& request);
  // Queues a prepared request (its callbacks inside). ResourceExhausted at once while the queue
  // holds EngineOptions::max_waiting_requests requests or max_queued_tokens prompt tokens (a
  // request is always queued when nothing waits); Unavailable once the engine stopped or is
  // unhealthy (see health()).
  absl::StatusOr<uint64_t> SubmitPrepared(PreparedRequest prepared);
  // Ends the request with Cancelled and frees its blocks (no effect once it finished).
  void Cancel(uint64_t id);
  // For a drain: requests that have not started (waiting for admission with no token generated)
  // end with `why` (not OK; Unavailable, so that a router runs them on another worker) at the
  // next step instead of being admitted, as do any preempted later before their first token;
  // SubmitPrepared refuses new ones with `why`. Running requests finish as usual. Irreversible.
  void EndUnstarted(absl::Status why);
  // Submits and waits for the end: the result, or the request's error.
  absl::StatusOr<RequestResult> Run(
      const EngineRequest& request,
      std::function<void(int32_t id, std::string_view text)> on_token = {});

  EngineStats stats() const;
  KvBlockCounts blocks() const;
  // OK, or why the engine stopped serving (its KV pool was found inconsistent: see
  // EngineCore::health()). Sticky: a worker reports NOT_SERVING and needs a restart.
  absl::Status health() const;
  // As of the last step, plus requests submitted since.
  EngineLoad load() const;

  // Document cache stores and evictions (see cache_events.h). The listener runs on the engine
  // thread: it must only queue the event. Replaces any previous listener.
  void set_cache_listener(CacheMirror::Listener listener) {
    cache_mirror_.set_listener(std::move(listener));
  }
  CacheSnapshot CachedDocuments() const { return cache_mirror_.Snapshot(); }
  // Waits until no request is queued or running, then checks the KV invariants.
  absl::Status WaitIdleAndCheck();
  const ModelIdentity& identity() const { return identity_; }
  const ModelConfig& config() const { return config_; }
  // Token ids of text documents tokenized before (Submit skips tokenizing them again).
  const DocumentTokenCache& token_cache() const { return token_cache_; }
  // Keys of token-id documents hashed before (Submit skips hashing them again).
  const DocumentKeyMemo& key_memo() const { return key_memo_; }

 private:
  void Loop();

  const ModelConfig config_;
  const Tokenizer* tokenizer_;
  const RequestLimits limits_;
  const int max_waiting_requests_;
  const int64_t max_queued_tokens_;
  const ModelIdentity identity_;
  DocumentTokenCache token_cache_;  // its own lock: Submit runs on the callers' threads
  DocumentKeyMemo key_memo_;        // likewise
  // Fed by core_'s document cache on the loop thread; its own lock. Declared before core_ so it
  // outlives it.
  CacheMirror cache_mirror_;
  EngineCore core_;  // touched only by the loop thread (and by WaitIdleAndCheck when idle)

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<uint64_t, PreparedRequest>> inbox_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> cancels_ ABSL_GUARDED_BY(mu_);
  absl::Status end_unstarted_ ABSL_GUARDED_BY(mu_);          // OK until EndUnstarted
  bool end_unstarted_pending_ ABSL_GUARDED_BY(mu_) = false;  // not handed to core_ yet
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool idle_ ABSL_GUARDED_BY(mu_) = true;
  EngineStats stats_ ABSL_GUARDED_BY(mu_);
  KvBlockCounts blocks_ ABSL_GUARDED_BY(mu_);
  EngineLoad load_ ABSL_GUARDED_BY(mu_);
  absl::Status health_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_ENGINE_ENGINE_H_
