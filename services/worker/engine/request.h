// What the engine accepts and reports: a RAG request (system prefix, documents, question), its
// streaming callbacks and its result.
#ifndef LAZYATTN_SERVICES_WORKER_ENGINE_REQUEST_H_
#define LAZYATTN_SERVICES_WORKER_ENGINE_REQUEST_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/document_key.h"
#include "services/worker/cache/cache_mode.h"
#include "services/worker/engine/sampler.h"
#include "services/worker/engine/top_logprobs.h"

namespace lazyattn {

// A document as text (tokenized alone, without BOS, special-token text kept literal) or as token
// ids. `id` is the client's name for it, echoed in errors.
struct EngineDocument {
  std::string id;
  std::string text;
  std::optional<std::vector<int32_t>> token_ids;
};

struct EngineRequest {
  // Text before the documents (e.g. a chat template's system turn and the start of the user turn).
  // Tokenized with special tokens parsed; BOS added when the model wants it. Shared through the
  // prefix tree in every mode.
  std::string system_prefix;
  std::vector<EngineDocument> documents;
  // Text after the documents (the question and the end of the user turn), special tokens parsed;
  // or, when set, the question as token ids.
  std::string question;
  std::optional<std::vector<int32_t>> question_token_ids;
  CacheMode mode = CacheMode::kLazy;
  SamplingParams sampling;
  // A Prefetch (its documents and a one-token question): a prompt or KV need too large is
  // refused naming `documents`, the only field its caller sent.
  bool prefetch = false;
  // A MonotonicNow() value (common/monotonic_time.h), as every time the engine keeps.
  absl::Time deadline = absl::InfiniteFuture();
  // Who may share this request's KV (common/document_key.h): the API key's cache namespace the
  // router sent and the request's cache_salt. Its documents and prefixes are cached under it.
  CacheScope cache_scope;
};

struct RequestUsage {
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;    // prompt tokens whose KV came from a cache
  int64_t computed_tokens = 0;  // prompt tokens this request computed (incl. documents it encoded)
  int64_t documents = 0;
  int64_t documents_hit = 0;    // documents found in the cache (any mode's notion of a hit)
  // Modes block and lazy: tokens of all documents, and of those whose KV came from the document
  // cache (a hit, or in mode block a copy from another offset) rather than being computed.
  int64_t document_tokens = 0;
  int64_t document_cached_tokens = 0;
  // Tokens of the documents reused under the request's own cache key: a cache hit, or an encoding
  // another request had started (joined). A block-mode copy from another offset is left out: this
  // is what the router predicts from the directory (docs/router.md, "Predictions").
  int64_t document_hit_tokens = 0;
  // Mode block: tokens of the documents copied from KV at another offset (in
  // document_cached_tokens, not in document_hit_tokens).
  int64_t document_copied_tokens = 0;
  // Modes block and lazy: tokens before the first document (its global offset).
  int64_t prefix_tokens = 0;
  int64_t completion_tokens = 0;
};

struct RequestResult {
  std::vector<int32_t> token_ids;  // generated; the EOS/stop token that ended it is left out
  // With SamplingParams::logprobs: each token_ids entry's log-probability (kSampleLogprob's: the
  // softmax of the penalized logits at temperature 1, before truncation); else empty.
  std::vector<float> logprobs;
  // With SamplingParams::top_logprobs = k > 0 and no RequestCallbacks::on_logprob: each
  // token_ids entry's k most likely tokens (TopLogprobs, top_logprobs.h); else empty (a caller
  // with on_logprob gets each list there, so a long generation does not keep them).
  std::vector<std::vector<TopLogprob>> top_logprobs;
  std::string text;
  std::string finish_reason;       // "stop" or "length"
  RequestUsage usage;
  double ttft_ms = 0;
  // Arrival to the first admission into the running batch (0 if never admitted); ttft_ms minus
  // this is the prefill time (admission to the first token, chunked steps included).
  double queue_ms = 0;
  double decode_tokens_per_s = 0;
  int preemptions = 0;
  std::vector<float> first_logits;  // kept only when EngineOptions::keep_first_logits
};

struct RequestCallbacks {
  // Each generated token and the text it completes (may be empty while a UTF-8 sequence or a
  // possible stop string is incomplete). Called on the engine thread: keep it short.
  std::function<void(int32_t id, std::string_view text)> on_token;
  // With SamplingParams::logprobs: the log-probability of the token whose on_token call follows
  // immediately (same thread), and its most likely alternatives (empty unless
  // SamplingParams::top_logprobs > 0; valid during the call). Not called for on_token's final
  // flush (id -1).
  std::function<void(float logprob, std::span<const TopLogprob> top)> on_logprob;
  // Before the first token: after each step that computed part of this request's prompt (its own
  // chunks, or a document encoding it waits for), with the prompt tokens whose KV is ready so
  // far. A sign of life for callers that time out a first token that is slow to come (a long
  // prompt on a slow backend). Engine thread; keep it short.
  std::function<void(int64_t prompt_tokens_ready)> on_prefill_progress;
  // Before the first token, while the request waits for its turn (for admission, or admitted, for
  // the step's token budget behind older prompts): after a step whose forward pass succeeded, at
  // most once per EngineCore::kQueuedReportInterval (a step that only preempted, or whose pass
  // failed, does not count).
  // A sign that the engine is alive and working through its queue. Engine thread; keep it short.
  std::function<void()> on_queued;
  // Exactly once: OK with the result, or the error (InvalidArgument, ResourceExhausted, Cancelled,
  // DeadlineExceeded, Unavailable at shutdown). `result` carries what was generated so far.
  std::function<void(const absl::Status& status, const RequestResult& result)> on_done;
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_ENGINE_REQUEST_H_
