#include "services/router/server/forwarding_call.h"

#include <algorithm>
#include <chrono>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/document_key.h"
#include "common/grpc_util.h"
#include "common/log.h"
#include "common/monotonic_time.h"
#include "common/worker_call_trailer.h"
#include "services/router/server/key_limits.h"
#include "services/router/server/model_choice.h"
#include "services/router/server/request_fingerprint.h"
#include "services/router/server/unknown_fields.h"
#include "services/router/server/worker_fit.h"

namespace lazyattn::router {

using lazyattn::v1::Final;
using lazyattn::v1::GenerateRequest;
using lazyattn::v1::GenerateResponse;

namespace {

// What the system text, chat template and earlier turns put before the documents, under the
// chosen model's tokenizer and template: the key under which the router learns its token count
// from the workers (document_placement.h). Two models count the same text differently, so the
// model is part of the key. Neither the documents nor the question nor sampling enter. The cache
// scope does (the API key's namespace, the request's cache_salt): learnt from one scope's
// requests, a length would place another scope's documents, and its predicted hits would tell
// that scope which system prompts others sent.
uint64_t PromptPrefixKey(const GenerateRequest& r, const std::optional<ModelKey>& model,
                         std::string_view cache_namespace) {
  std::vector<std::pair<std::string_view, std::string_view>> turns;
  for (int i = 0; i + 1 < r.messages_size(); ++i) {
    turns.emplace_back(r.messages(i).role(), r.messages(i).content());
  }
  // Views of the key's own strings (a `cond ? str : ""` would make a temporary std::string).
  const std::string_view model_fingerprint =
      model ? std::string_view(model->model_fingerprint) : std::string_view();
  const std::string_view tokenizer_fingerprint =
      model ? std::string_view(model->tokenizer_fingerprint) : std::string_view();
  return absl::HashOf(model_fingerprint, tokenizer_fingerprint, std::string_view(r.system()),
                      r.chat() || r.messages_size() > 0, r.messages_size(), turns, cache_namespace,
                      std::string_view(r.cache_salt()));
}

std::string CodeText(grpc::StatusCode code) { return absl::AsciiStrToUpper(StatusCodeLabel(code)); }

// The worker got the client's deadline with the call, as a timeout, so it can expire there a
// little before the router's clock says so: within this skew an expiry is the client's.
constexpr auto kDeadlineSkew = std::chrono::milliseconds(100);

// The client's x-request-id when it is a valid id, else a fresh one.
std::string RequestIdOf(const grpc::CallbackServerContext* context) {
  if (context != nullptr) {
    const auto& metadata = context->client_metadata();
    if (auto it = metadata.find(kRequestIdKey); it != metadata.end()) {
      const std::string_view id(it->second.data(), it->second.size());
      if (IsValidRequestId(id)) return std::string(id);
    }
  }
  return NewRequestId();
}

int64_t QuarantineSeconds(const RouterContext& router) {
  return absl::ToInt64Seconds(router.options().routing.quarantine.ttl);
}

}  // namespace

// --- ForwardingCall ------------------------------------------------------------------------------

ForwardingCall::ForwardingCall(RouterContext* router, grpc::CallbackServerContext* server_context,
                               const GenerateRequest* request)
    : router_(router),
      server_context_(server_context),
      request_id_(RequestIdOf(server_context)),
      cache_namespace_(CacheNamespaceOf(*server_context)),
      deadline_(server_context->deadline()),
      request_(WithoutUnknownFields(request, known_fields_copy_)),
      started_(MonotonicNow()),
      model_metrics_(&router->metrics().NoModel()),
      budget_request_(router->retry_budget().StartRequest()) {
  // Initial metadata goes out with the first token or the end, both later than this.
  server_context->AddInitialMetadata(kRequestIdKey, request_id_);
}

ForwardingCall::ForwardingCall(RouterContext* router,
                               std::chrono::system_clock::time_point deadline,
                               const GenerateRequest* request, std::string cache_namespace,
                               std::string request_id)
    : router_(router),
      server_context_(nullptr),
      request_id_(std::move(request_id)),
      cache_namespace_(std::move(cache_namespace)),
      deadline_(deadline),
      // Not read here: the HTTP front passes its own member, built after this base. Its requests
      // are built from JSON, so they hold no fields this router does not know.
      request_(request),
      started_(MonotonicNow()),
      model_metrics_(&router->metrics().NoModel()),
      budget_request_(router->retry_budget().StartRequest()) {}

std::unique_ptr<grpc::ClientContext> ForwardingCall::NewWorkerContext() const {
  std::unique_ptr<grpc::ClientContext> context;
  if (server_context_ != nullptr) {
    // The client's deadline propagates; its cancellation does not: OnCancel cancels the worker
    // call itself (ClientCancelled), after marking the call cancelled. Propagated, the
    // cancellation could end the worker call before OnCancel ran, and the attempt's CANCELLED
    // then read as the worker failing mid-stream (UNAVAILABLE in the log and the metrics).
    context = grpc::ClientContext::FromCallbackServerContext(
        *server_context_, grpc::PropagationOptions().disable_cancellation_propagation());
  } else {
    context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(deadline_);
  }
  context->AddMetadata(kRequestIdKey, request_id_);
  // Signs of life during a long prefill, which move the first-token timeout (WorkerAttempt).
  context->AddMetadata(kPrefillProgressKey, kPrefillProgressValue);
  // Whose KV the request may share (common/document_key.h).
  if (!cache_namespace_.empty()) context->AddMetadata(kCacheNamespaceMetadata, cache_namespace_);
  // The worker refuses the call (UNAVAILABLE, failed over) if it no longer holds this model.
  if (model_.has_value()) {
    context->AddMetadata(kExpectedModelKey, ExpectedModelValue(model_->model_fingerprint,
                                                               model_->tokenizer_fingerprint));
  }
  return context;
}

const RequestFingerprint& ForwardingCall::Fingerprint() {
  std::call_once(fingerprint_once_, [this] {
    fingerprint_ = FingerprintOf(*request_, model_.has_value() ? &*model_ : nullptr);
  });
  return fingerprint_;
}

void ForwardingCall::Begin() {
  // The model first: the quarantine's fingerprint, the document keys and the plan depend on it.
  absl::StatusOr<std::optional<ModelGroup>> model =
      ChooseModel(router_->registry(), router_->options().limits, *request_);
  if (!model.ok()) {
    End(ToGrpcStatus(model.status()), std::nullopt);
    return;
  }
  if (model->has_value()) {
    model_ = (*model)->key;
    model_metrics_ = &router_->metrics().ForModel((*model)->id);
  }
  QueryQuarantine& quarantine = router_->quarantine();
  // Hashing the request costs a pass over it: only while some quarantine is live (remembered
  // losses and expired quarantines refuse nothing).
  absl::Time until;
  const absl::Time now = MonotonicNow();
  if (quarantine.AnyQuarantined(now) && quarantine.IsQuarantined(Fingerprint(), now, &until)) {
    model_metrics_->CountQuarantined();
    End(grpc::Status(
            grpc::StatusCode::FAILED_PRECONDITION,
            absl::StrCat("request quarantined: requests with this content (fingerprint ",
                         Fingerprint().ToHex(),
                         ") lost worker connections mid-call in two crashes, as a request that "
                         "crashes workers does; refused for another ",
                         std::max<int64_t>(1, absl::ToInt64Seconds(until - MonotonicNow())),
                         " s (routing.quarantine_ttl_s ", QuarantineSeconds(*router_), ")")),
        std::nullopt);
    return;
  }
  std::vector<DocumentRef> docs = router_->DocumentRefs(
      request_->documents(), request_->cache_mode(), model_.has_value() ? &*model_ : nullptr,
      CacheScope{cache_namespace_, request_->cache_salt()});
  if (request_->cache_mode() == lazyattn::v1::CACHE_MODE_BLOCK) {
    // Block KV is a hit only where this request places the document (docs/router.md).
    std::vector<int64_t> exact_tokens;
    exact_tokens.reserve(request_->documents_size());
    for (const auto& d : request_->documents()) {
      exact_tokens.push_back(d.has_tokens() ? d.tokens().ids_size() : -1);
    }
    const uint64_t prefix = PromptPrefixKey(*request_, model_, cache_namespace_);
    PlaceBlockDocuments(docs, prefix, router_->selector().prefix_lengths().Get(prefix),
                        exact_tokens);
  }
  router_->PlanAsync(
      std::move(docs), [this](RoutePlan plan) { OnPlan(std::move(plan)); }, model_);
}

void ForwardingCall::OnPlan(RoutePlan plan) {
  router_->metrics().ObserveRouting(MonotonicNow() - started_);
  {
    absl::MutexLock lock(&mu_);
    plan_ = std::move(plan);
    ranked_workers_ = plan_.workers.size();
  }
  StartNextAttempt();
}

grpc::Status ForwardingCall::ExhaustedStatus() const {
  if (failures_.empty() && model_.has_value()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "no live workers of the request's model (it was served a moment ago)");
  }
  if (failures_.empty()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "no live workers: the directory lists none and no static worker is "
                        "configured");
  }
  return grpc::Status(last_code_, absl::StrCat("no worker could serve the request (", attempts_,
                                               attempts_ == 1 ? " attempt" : " attempts",
                                               "): ", absl::StrJoin(failures_, "; ")));
}

bool ForwardingCall::AddWorkersLeftOutOfThePlan(absl::Time now) {
  const RoutePlan now_live =
      router_->Plan(plan_.docs, /*lookup=*/nullptr, now, model_.has_value() ? &*model_ : nullptr);
  // Every worker out (a panic plan lists them all regardless): none has recovered.
  if (now_live.breaker_panic) return false;
  bool added = false;
  for (size_t i = 0; i < now_live.workers.size(); ++i) {
    const WorkerInfo& w = now_live.workers[i];
    const bool planned = std::any_of(plan_.workers.begin(), plan_.workers.end(),
                                     [&w](const WorkerInfo& p) { return p.id == w.id; });
    if (planned) continue;
    plan_.workers.push_back(w);
    plan_.predicted_hits.push_back(now_live.predicted_hits[i]);
    plan_.claimed_tokens.push_back(now_live.claimed_tokens[i]);
    plan_.claimed_copy_tokens.push_back(now_live.claimed_copy_tokens[i]);
    added = true;
  }
  return added;
}

void ForwardingCall::StartNextAttempt() {
  std::shared_ptr<WorkerAttempt> attempt;
  int64_t predicted_hits = 0;
  int attempt_number = 0;
  std::vector<DocumentRef> docs;
  grpc::Status failure;
  bool retry_refused = false;
  bool skipped_unfit = false;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = MonotonicNow();
    const int max_attempts = router_->options().routing.max_attempts;
    if (cancelled_) {
      failure = cancel_status_;
    } else {
      auto& breakers = router_->selector().breakers();
      while (attempt == nullptr && attempts_ < max_attempts) {
        std::optional<PlanCursor::Next> next =
            cursor_.Advance(plan_.workers.size(), /*nothing_sent=*/attempts_ == 0);
        if (!next.has_value() && attempts_ > 0 && AddWorkersLeftOutOfThePlan(now)) {
          next = cursor_.Advance(plan_.workers.size(), /*nothing_sent=*/false);
        }
        if (!next.has_value()) break;
        const size_t index = next->index;
        const WorkerInfo& w = plan_.workers[index];
        if (std::optional<std::string> why = WhyCannotServe(w, *request_)) {
          failures_.push_back(absl::StrCat(w.id, " (", w.address, "): ", *why));
          skipped_unfit = true;
          continue;
        }
        // A panic plan sends to its workers regardless; a worker appended since takes its
        // breaker's permit (its half-open probe, if that is where it stands).
        const bool panic = plan_.breaker_panic && index < ranked_workers_;
        const CircuitBreakers::Permit permit =
            panic || next->bypass_breaker ? breakers.Bypass(w.id) : breakers.TryAcquire(w.id, now);
        if (!permit) {
          // Opened (or its probe taken) since the plan was made.
          failures_.push_back(absl::StrCat(w.id, " (", w.address, "): circuit breaker open"));
          cursor_.SetAside(index);
          continue;
        }
        auto stub = router_->registry().Stub(w.address, w.id);
        if (!stub.ok()) {
          breakers.Release(w.id, permit);
          failures_.push_back(absl::StrCat(w.id, " (", w.address, "): ", stub.status().message()));
          continue;
        }
        // A request its last worker handed back unstarted moves rather than repeats: no budget.
        if (attempts_ > 0 && !budget_retry_.held() && !last_attempt_handed_back_) {
          budget_retry_ = router_->retry_budget().TryStartRetry();
          if (!budget_retry_.held()) {
            // Many requests are failing over at once: this one ends with its failure rather
            // than add to the load on the workers that are left.
            breakers.Release(w.id, permit);
            failures_.push_back(absl::StrCat(
                "failover to ", w.id, " not tried: the retry budget is spent (",
                router_->retry_budget().retries_in_flight(),
                " failovers in flight; routing.retry_budget_percent, retry_budget_min)"));
            retry_refused = true;
            break;
          }
        }
        ++attempts_;
        attempt = std::make_shared<WorkerAttempt>(this, w, permit, *stub, NewWorkerContext());
        current_ = attempt;
        last_worker_ = w.id;
        tokens_ = 0;
        streamed_text_.clear();
        final_.reset();
        predicted_hits = plan_.predicted_hits[index];
        current_predicted_hits_ = predicted_hits;
        current_prediction_ranked_ = index < ranked_workers_;
        current_claimed_tokens_ = plan_.claimed_tokens[index];
        current_claimed_copy_tokens_ = plan_.claimed_copy_tokens[index];
        attempt_number = attempts_;
        docs = plan_.docs;
      }
      if (attempt == nullptr) {
        // Only workers that cannot apply the request were tried, and no live worker of its
        // model can: no retry helps until they are upgraded. (One that can but is ejected or
        // behind an open breaker for now leaves it UNAVAILABLE.)
        if (attempts_ == 0 && skipped_unfit &&
            !AnyWorkerCouldServe(router_->registry(), model_, *request_)) {
          last_code_ = grpc::StatusCode::FAILED_PRECONDITION;
          failure = NoWorkerCanApply(router_->registry(), model_, *request_);
        } else {
          failure = ExhaustedStatus();
        }
      }
    }
  }
  if (attempt == nullptr) {
    if (retry_refused) model_metrics_->CountRetryRefused();
    End(failure, std::nullopt);
    return;
  }
  const std::string& id = attempt->worker().id;
  router_->metrics().CountSelection(id, *model_metrics_);
  if (attempt_number == 1) {
    model_metrics_->AddPredictedHitTokens(predicted_hits);
  } else {
    model_metrics_->CountRetry();
  }
  router_->registry().AddInflight(attempt->worker(), 1);
  // The attempt's documents are on their way to the worker until its first token (when they are
  // stored, and kvdir soon says so), however long it queues there: hold the speculative entries
  // that long, as far as the first-token timeout allows.
  const RoutingOptions& routing = router_->options().routing;
  router_->selector().RecordChoice(
      docs, id, MonotonicNow(),
      routing.first_token_timeout > absl::ZeroDuration()
          ? std::max(routing.speculative.ttl, routing.first_token_timeout)
          : routing.speculative.ttl);
  attempt->Start(attempt, request_,
                 {.first_token = routing.first_token_timeout,
                  .first_token_max_wait = routing.first_token_max_wait,
                  .between_tokens = routing.token_idle_timeout});
}

void ForwardingCall::OnWorkerMessage(WorkerAttempt* attempt, const GenerateResponse& message) {
  if (message.has_token()) {
    bool deliver = false;
    {
      absl::MutexLock lock(&mu_);
      if (!cancelled_ && !ended_) {
        ++tokens_;
        streamed_text_ += message.token().text();
        if (first_token_at_ == absl::InfinitePast()) first_token_at_ = MonotonicNow();
        // Prefill done: the documents are stored; the entries last the TTL from here.
        if (tokens_ == 1) {
          router_->selector().RecordChoice(plan_.docs, attempt->worker().id, MonotonicNow());
        }
        write_pending_ = true;
        deliver = true;
      }
    }
    if (deliver) {
      DeliverToken(message);
    } else {
      attempt->Cancel();
    }
    return;
  }
  if (message.has_final()) {
    absl::MutexLock lock(&mu_);
    final_ = message.final();
    // The answer is what the tokens said, whatever the worker's copy of it claims: a stream
    // client and a unary one get the same text, bounded as the tokens are (worker_stream_check.h).
    final_->set_text(streamed_text_);
  }
  attempt->ReadNext();
}

void ForwardingCall::ClientWriteDone(bool ok) {
  std::shared_ptr<WorkerAttempt> attempt;
  bool cancel = false;
  std::optional<std::pair<grpc::Status, std::optional<Final>>> end;
  {
    absl::MutexLock lock(&mu_);
    write_pending_ = false;
    if (deferred_end_.has_value()) {
      end = std::move(deferred_end_);
      deferred_end_.reset();
    } else {
      if (!ok) cancelled_ = true;  // the client's stream is gone
      cancel = cancelled_;
      attempt = current_;
    }
  }
  if (end.has_value()) {
    DeliverEnd(end->first, end->second.has_value() ? &*end->second : nullptr);
    return;
  }
  if (attempt == nullptr) return;
  if (cancel) {
    attempt->Cancel();
  } else {
    attempt->ReadNext();
  }
}

void ForwardingCall::SetCancelStatus(grpc::Status why) {
  absl::MutexLock lock(&mu_);
  if (cancel_status_set_) return;
  cancel_status_set_ = true;
  cancel_status_ = std::move(why);
}

void ForwardingCall::ClientCancelled() {
  // gRPC cancels the calls that outlast a shutdown's grace: the router's doing, which the client
  // sees as UNAVAILABLE; logged and counted as the client's, a restart read as clients leaving.
  if (server_context_ != nullptr && router_->shutting_down()) {
    SetCancelStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                 "the router is shutting down; cancelled at the end of its drain"));
  }
  std::shared_ptr<WorkerAttempt> attempt;
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    attempt = current_;
  }
  if (attempt != nullptr) attempt->Cancel();
}

void ForwardingCall::OnAttemptDone(WorkerAttempt* attempt, const grpc::Status& worker_status) {
  const WorkerInfo& w = attempt->worker();
  router_->registry().AddInflight(w, -1);
  auto& breakers = router_->selector().breakers();
  grpc::Status status = JudgeAttemptEnd(attempt, worker_status);
  // The worker died holding this request (not a refusal, a timeout or our cancellation).
  const bool lost = attempt->LostMidCall(worker_status);
  const bool handed_back = attempt->HandedBack(worker_status);
  if (lost) {
    model_metrics_->CountConnectionLoss();
    (void)Fingerprint();  // hashed here, outside mu_
  }
  std::optional<Final> final;
  bool retry = false;
  bool quarantined = false;
  {
    absl::MutexLock lock(&mu_);
    current_.reset();
    last_attempt_handed_back_ = handed_back;
    if (status.ok() && !final_.has_value()) {
      model_metrics_->CountWorkerProtocolError();
      status = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            "the worker ended its stream without a final message (or with one "
                            "that does not parse)");
    }
    if (status.ok()) {
      breakers.RecordSuccess(w.id, attempt->permit(), MonotonicNow());
      final = std::move(final_);
      final->set_worker(w.id);
      final->set_attempts(attempts_);
      // The prediction for the worker that served, against what it reports it reused; its prefix
      // length places later block-mode requests with the same prefix.
      const int64_t predicted = current_predicted_hits_;
      final->set_predicted_hit_tokens(predicted);
      if (!plan_.docs.empty()) {
        // An appended worker's prediction saw no directory lookup: not a prediction to score.
        if (current_prediction_ranked_) {
          model_metrics_->ObservePrediction(predicted, final->usage().document_hit_tokens());
        }
        router_->ObserveClaim(w.id, current_claimed_tokens_, current_claimed_copy_tokens_,
                              final->usage());
        router_->selector().prefix_lengths().Record(
            PromptPrefixKey(*request_, model_, cache_namespace_), final->usage().prefix_tokens());
      }
    } else {
      // No first token: the worker may never store these documents; predict nothing there.
      if (tokens_ == 0) {
        router_->selector().RecordChoice(plan_.docs, w.id, MonotonicNow(), absl::ZeroDuration());
      }
      const grpc::StatusCode code = status.error_code();
      const bool client_deadline_passed =
          deadline_ <= std::chrono::system_clock::now() + kDeadlineSkew;
      // The client's own deadline expiring says nothing about the worker.
      const bool client_expiry =
          code == grpc::StatusCode::DEADLINE_EXCEEDED && client_deadline_passed;
      if (IsWorkerFault(code) && !cancelled_ && !client_expiry) {
        breakers.RecordFailure(w.id, attempt->permit(), MonotonicNow());
      } else {
        breakers.Release(w.id, attempt->permit());
      }
      // Every code, the client's faults too: a code that is no worker fault (INVALID_ARGUMENT)
      // touches no breaker, since a client's bad requests would eject every worker, but one worker
      // answering it to what the others serve shows here (alert LazyattnWorkerRefusesRequests).
      if (!cancelled_ && !client_expiry && !handed_back) {
        router_->metrics().CountWorkerFailure(w.id, *model_metrics_, code);
      }
      if (cancelled_) {
        status = cancel_status_;
      } else if (client_expiry) {
        // Whatever was streamed, the client's deadline ended the call: say so, not UNAVAILABLE.
        status = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline exceeded");
      } else if (tokens_ > 0 && StreamsToClient()) {
        status = grpc::Status(
            grpc::StatusCode::UNAVAILABLE,
            absl::StrCat("worker ", w.id, " (", w.address, ") failed after ", tokens_,
                         " tokens were streamed: ", CodeText(code), ": ", status.error_message(),
                         "; not retried on another worker because output had been sent"));
      } else {
        const bool deadline_passed =
            deadline_ <= std::chrono::system_clock::now();
        last_code_ = code;
        failures_.push_back(absl::StrCat(w.id, " (", w.address, "): ", CodeText(code), ": ",
                                         status.error_message()));
        if (IsRetryable(code) && !deadline_passed) {
          retry = true;
          if (tokens_ > 0) DiscardPartial();
        } else if (code != grpc::StatusCode::INVALID_ARGUMENT &&
                   code != grpc::StatusCode::DEADLINE_EXCEEDED) {
          status = grpc::Status(
              code, absl::StrCat("worker ", w.id, " (", w.address, "): ", status.error_message()));
        }
      }
      if (lost && !cancelled_ && !client_expiry &&
          router_->quarantine().RecordLoss(fingerprint_, w.id, MonotonicNow())) {
        // The second worker lost on this content: no third.
        quarantined = true;
        retry = false;
        status = grpc::Status(
            grpc::StatusCode::FAILED_PRECONDITION,
            absl::StrCat("request quarantined (fingerprint ", fingerprint_.ToHex(),
                         "): its attempts lost the connection to their workers mid-call, as a "
                         "request that crashes workers does (last: worker ",
                         w.id, " (", w.address, "): ", worker_status.error_message(),
                         "); not retried, and requests with the same content are refused for ",
                         QuarantineSeconds(*router_), " s (routing.quarantine_ttl_s)"));
      }
    }
  }
  if (quarantined) {
    model_metrics_->CountQuarantined();
    // Never the prompt: the fingerprint names the content.
    LogWarning("router")
        .Str("request_id", request_id_)
        .Str("fingerprint", fingerprint_.ToHex())
        .Int("quarantine_s", QuarantineSeconds(*router_))
        .Str("worker", w.id)
        .Str("address", w.address)
        .Msg("request quarantined: the second worker lost mid-call on this content");
  }
  if (retry) {
    StartNextAttempt();
  } else {
    End(status, std::move(final));
  }
}

void ForwardingCall::End(grpc::Status status, std::optional<Final> final) {
  const grpc::StatusCode code = status.error_code();
  if ((code == grpc::StatusCode::CANCELLED || code == grpc::StatusCode::UNAVAILABLE ||
       code == grpc::StatusCode::DEADLINE_EXCEEDED) &&
      deadline_ <= std::chrono::system_clock::now() + kDeadlineSkew) {
    // The client's deadline ended the call, whichever way its expiry reached us first (gRPC's
    // cancellation at the deadline, the worker's DEADLINE_EXCEEDED, a failover cut short): one
    // status and one label for one expiry.
    status = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline exceeded");
  }
  {
    absl::MutexLock lock(&mu_);
    if (ended_) return;
    ended_ = true;
    budget_retry_.Reset();  // no longer in flight, however long the object lingers
    budget_request_.Reset();
    model_metrics_->CountRequest(status.error_code());
    LogAccess(status, final.has_value() ? &*final : nullptr);
    if (write_pending_) {
      deferred_end_.emplace(std::move(status), std::move(final));
      return;
    }
  }
  DeliverEnd(status, final.has_value() ? &*final : nullptr);
}

}  // namespace lazyattn::router
