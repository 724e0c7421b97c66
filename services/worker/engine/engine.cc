#include "services/worker/engine/engine.h"

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/monotonic_time.h"
#include "services/worker/engine/cpu_runner.h"
#include "services/worker/model/model_fingerprint.h"

namespace lazyattn {

Engine::Engine(const ModelWeights* weights, const Tokenizer* tokenizer, EngineOptions options,
               RequestLimits limits)
    : Engine(std::make_unique<CpuModelRunner>(weights, options.num_kv_blocks),
             ModelFingerprint(*weights), tokenizer, options, limits) {}

Engine::Engine(std::unique_ptr<ModelRunner> runner, std::string model_fingerprint,
               const Tokenizer* tokenizer, EngineOptions options, RequestLimits limits)
    : config_(runner->config()),
      tokenizer_(tokenizer),
      limits_(limits),
      max_waiting_requests_(options.max_waiting_requests),
      max_queued_tokens_(options.max_queued_tokens),
      identity_{std::move(model_fingerprint), TokenizerFingerprint(*tokenizer)},
      token_cache_(options.document_token_cache_tokens),
      key_memo_(options.document_key_memo_tokens),
      core_(std::move(runner), tokenizer, options) {
  const BlockPool& pool = core_.cache().pool();
  blocks_ = {pool.num_blocks(), pool.num_free(), pool.num_referenced(),
             pool.num_cached_unreferenced()};
  // Before the loop starts: afterwards the document cache belongs to the loop thread.
  core_.cache().documents().set_listener(
      [this](const DocCacheKey& key, int64_t tokens, bool stored) {
        cache_mirror_.Apply(key, tokens, stored);
      });
  thread_ = std::thread([this] { Loop(); });
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  // Requests still in the inbox never reached the core.
  for (auto& [id, p] : inbox_) {
    if (p.callbacks.on_done) p.callbacks.on_done(absl::UnavailableError("engine shut down"), {});
  }
}

absl::StatusOr<uint64_t> Engine::Submit(const EngineRequest& request, RequestCallbacks callbacks) {
  const absl::Time submitted = MonotonicNow();
  auto prepared = Prepare(request);
  if (!prepared.ok()) return prepared.status();
  prepared->callbacks = std::move(callbacks);
  prepared->submitted = submitted;
  return SubmitPrepared(std::move(*prepared));
}

absl::StatusOr<PreparedRequest> Engine::Prepare(const EngineRequest& request) {
  return PrepareRequest(request, *tokenizer_, config_, identity_, limits_,
                        {.token_ids = &token_cache_, .keys = &key_memo_});
}

absl::StatusOr<uint64_t> Engine::SubmitPrepared(PreparedRequest prepared) {
  if (prepared.submitted == absl::InfinitePast()) prepared.submitted = MonotonicNow();
  const int64_t tokens = prepared.prompt_tokens();
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return absl::UnavailableError("engine shut down");
    if (!health_.ok()) return absl::UnavailableError(health_.message());
    if (!end_unstarted_.ok()) return end_unstarted_;
    // The queue as of the last step, plus what arrived since.
    const int64_t waiting = load_.waiting + static_cast<int64_t>(inbox_.size());
    int64_t queued_tokens = load_.waiting_tokens;
    for (const auto& [unused, p] : inbox_) queued_tokens += p.prompt_tokens();
    if (waiting > 0 && (waiting >= max_waiting_requests_ ||
                        queued_tokens + tokens > max_queued_tokens_)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "worker queue full: ", waiting, " requests with ", queued_tokens,
          " prompt tokens wait (limits engine.max_waiting_requests ", max_waiting_requests_,
          ", engine.max_queued_tokens ", max_queued_tokens_, ")"));
    }
    id = next_id_++;
    inbox_.emplace_back(id, std::move(prepared));
    idle_ = false;
  }
  cv_.notify_all();
  return id;
}

void Engine::Cancel(uint64_t id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancels_.push_back(id);
  }
  cv_.notify_all();
}

void Engine::EndUnstarted(absl::Status why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!end_unstarted_.ok()) return;
    end_unstarted_ = std::move(why);
    end_unstarted_pending_ = true;
  }
  cv_.notify_all();
}

absl::StatusOr<RequestResult> Engine::Run(
    const EngineRequest& request, std::function<void(int32_t, std::string_view)> on_token) {
  absl::Notification done;
  absl::Status status;
  RequestResult result;
  RequestCallbacks callbacks{.on_token = std::move(on_token),
                             .on_done = [&](const absl::Status& s, const RequestResult& r) {
                               status = s;
                               result = r;
                               done.Notify();
                             }};
  auto id = Submit(request, std::move(callbacks));
  if (!id.ok()) return id.status();
  done.WaitForNotification();
  if (!status.ok()) return status;
  return result;
}

EngineStats Engine::stats() const {
  EngineStats s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s = stats_;
  }
  s.text_docs_tokenized = token_cache_.misses();
  s.text_docs_reused = token_cache_.hits();
  s.id_docs_hashed = key_memo_.misses();
  s.id_docs_reused = key_memo_.hits();
  return s;
}

absl::Status Engine::health() const {
  std::lock_guard<std::mutex> lock(mu_);
  return health_;
}

KvBlockCounts Engine::blocks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return blocks_;
}

EngineLoad Engine::load() const {
  EngineLoad load;
  // Keys of the inbox's documents, checked against the mirror after mu_ is released (the mirror
  // has its own lock; never nested).
  std::vector<std::pair<DocCacheKey, int64_t>> documents;
  {
    std::lock_guard<std::mutex> lock(mu_);
    load = load_;
    for (const auto& [id, p] : inbox_) {
      ++load.waiting;
      load.waiting_tokens += p.prompt_tokens();
      load.queued_prefill_tokens +=
          PrefillTokensToCompute(p, [&](const DocCacheKey& key, int64_t tokens) {
            documents.emplace_back(key, tokens);
            return false;
          });
    }
  }
  // Requests submitted since the last step: their documents the cache holds are no work (the
  // core's own estimate also knows what its jobs encode).
  for (const auto& [key, tokens] : documents) {
    if (cache_mirror_.Contains(key) ||
        (key.offset != DocCacheKey::kAnyOffset &&
         cache_mirror_.Contains({key.doc, DocCacheKey::kAnyOffset}))) {
      load.queued_prefill_tokens -= tokens;
    }
  }
  return load;
}

absl::Status Engine::WaitIdleAndCheck() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return idle_ || stop_; });
  // The loop thread is parked on cv_ with the lock released and no work: the core is quiescent.
  return core_.cache().CheckInvariant();
}

void Engine::Loop() {
  while (true) {
    std::vector<std::pair<uint64_t, PreparedRequest>> incoming;
    std::vector<uint64_t> cancels;
    absl::Status end_unstarted;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!core_.HasWork() && inbox_.empty() && cancels_.empty() && !stop_) {
        idle_ = true;
        cv_.notify_all();
        cv_.wait(lock, [&] { return stop_ || !inbox_.empty() || !cancels_.empty(); });
      }
      if (stop_) return;
      incoming.swap(inbox_);
      cancels.swap(cancels_);
      // With the inbox, so that every request submitted before EndUnstarted is in the core when
      // the core learns of it (and every later one was refused).
      if (end_unstarted_pending_) {
        end_unstarted = end_unstarted_;
        end_unstarted_pending_ = false;
      }
      idle_ = false;
    }
    for (auto& [id, p] : incoming) core_.Add(std::move(p), id);
    for (uint64_t id : cancels) core_.Cancel(id);
    if (!end_unstarted.ok()) core_.EndUnstarted(end_unstarted);
    const bool progressed = core_.Step(MonotonicNow());
    // Outside the lock: Submit and Cancel (gRPC threads) do not wait for it.
    const EngineLoad load = core_.PublishedLoad(MonotonicNow());
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_ = core_.stats();
      const BlockPool& pool = core_.cache().pool();
      blocks_ = {pool.num_blocks(), pool.num_free(), pool.num_referenced(),
                 pool.num_cached_unreferenced()};
      load_ = load;
      health_ = core_.health();
    }
    if (!progressed && core_.HasWork()) {
      // Nothing could run (e.g. waiting on a deadline): avoid spinning.
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(1));
    }
  }
}

}  // namespace lazyattn
